"""The terminator (hydra.sweeper.terminator=true): trials it saves and what that costs the best.

    python bench/bench_terminator.py --storage sqlite:///sweeps.db --study racing-truth-12

Replays TPE studies over lr (log range of the recorded grid) on a truth study of
bench/RACING.md: each trial's lr is answered by the nearest recorded lr (log space) with one of
its seeds drawn at random, recorded on the trial as the sweep records a seed (its value and
its eval's standard error over problems), so sweeper/sweep/terminator.py judges exactly what it
would in a sweep with seeds=1 (--seeds N: N seeds drawn without replacement, the trial's value
their mean, as with hydra.sweeper.seeds=N). Each replay runs all n_trials and notes where the terminator
first said stop; reported: that trial count (mean, sd, how often before n_trials), and the
truth's mean at the best trial's lr when it stopped against after all n_trials. Caveat: the
nearest-point landscape is a step function of 5 points. Writes
bench/results/terminator_<study>.json.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
from pathlib import Path

import optuna
from machine_info import machine  # bench/ is on the path: this runs as a script
from optuna.distributions import FloatDistribution

from records.sweep import Replicate, State, replicate_key, replicates
from sweeper.sweep.terminator import stop_reason

RESULTS = Path(__file__).resolve().parent / "results"


def recorded(storage: str, study: str) -> dict[float, list[Replicate]]:
    """{lr: its completed seed records} of the truth study."""
    s = optuna.load_study(study_name=study, storage=storage)
    out = {}
    for t in s.get_trials(deepcopy=False):
        done = [r for r in replicates(t) if r.state == State.COMPLETE]
        if done:
            out[t.params["lr"]] = done
    return out


def replay(
    seeds: dict[float, list], n_trials: int, min_trials: int, seed: int, per_trial: int
) -> dict:
    rng = random.Random(seed)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    space = {"lr": FloatDistribution(min(seeds), max(seeds), log=True)}
    truth = {lr: statistics.fmean(r.value for r in rs) for lr, rs in seeds.items()}
    stopped_at, best_at_stop = None, None
    for n in range(1, n_trials + 1):
        trial = study.ask(space)
        lr = min(seeds, key=lambda x: abs(math.log(x) - math.log(trial.params["lr"])))
        drawn = rng.sample(seeds[lr], per_trial)  # the trial's seeds, as seeds=N runs them
        for i, record in enumerate(drawn):
            trial.set_user_attr(replicate_key(i), record.as_attr())
        study.tell(trial, statistics.fmean(r.value for r in drawn))
        if stopped_at is None and stop_reason(study.trials, True, min_trials, n_trials, seed):
            stopped_at = n
            best_at_stop = truth[_nearest(seeds, study.best_trial.params["lr"])]
    best_at_end = truth[_nearest(seeds, study.best_trial.params["lr"])]
    return {
        "stopped_at": stopped_at or n_trials,
        "stopped_early": stopped_at is not None and stopped_at < n_trials,
        "best_true_mean_at_stop": best_at_stop if stopped_at else best_at_end,
        "best_true_mean_at_end": best_at_end,
    }


def _nearest(seeds: dict[float, list], lr: float) -> float:
    return min(seeds, key=lambda x: abs(math.log(x) - math.log(lr)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--storage", default="sqlite:///sweeps.db")
    p.add_argument("--study", default="racing-truth-12")
    p.add_argument("--n-trials", type=int, default=20)
    p.add_argument("--min-trials", type=int, default=5)  # terminator_min_trials' default
    p.add_argument("--repetitions", type=int, default=30)
    p.add_argument("--seeds", type=int, default=1, help="seeds per trial (hydra.sweeper.seeds)")
    args = p.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seeds = recorded(args.storage, args.study)
    rows = [
        replay(seeds, args.n_trials, args.min_trials, r, args.seeds)
        for r in range(args.repetitions)
    ]
    stops = [r["stopped_at"] for r in rows]
    loss = [r["best_true_mean_at_end"] - r["best_true_mean_at_stop"] for r in rows]
    out = {
        "truth": {lr: statistics.fmean(r.value for r in rs) for lr, rs in seeds.items()},
        "n_trials": args.n_trials,
        "min_trials": args.min_trials,
        "seeds_per_trial": args.seeds,
        "repetitions": args.repetitions,
        "stopped_at_mean": statistics.fmean(stops),
        "stopped_at_sd": statistics.stdev(stops),
        "stopped_at_range": [min(stops), max(stops)],
        "stopped_early_rate": sum(r["stopped_early"] for r in rows) / len(rows),
        "best_true_mean_lost_mean": statistics.fmean(loss),
        "best_true_mean_lost_max": max(loss),
        "machine": machine(),
        "rows": rows,
    }
    suffix = f"_seeds{args.seeds}" if args.seeds > 1 else ""
    path = RESULTS / f"terminator_{args.study}{suffix}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
