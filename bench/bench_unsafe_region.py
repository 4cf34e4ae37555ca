"""Breaches as constraints: does TPE sample the unsafe region less? Replayed from a recorded lr grid.

    python -m sweeper -m lr=1e-3,2e-3,3e-3,5e-3,8e-3,1.3e-2,2e-2,3e-2 hydra.sweeper.seeds=2 \
        max_steps=8 batch_size=8 group_size=4 task.eval_size=100 eval_every=0 \
        hydra.sweeper.study_name=unsafe-landscape          # the landscape, health rules on
    python bench/bench_unsafe_region.py --storage sqlite:///sweeps.db --study unsafe-landscape

The landscape is one real sweep: at each recorded lr, whether a health rule pruned it (the
unsafe region) and otherwise its seeds' values. A TPE study over lr on the grid's log range
(the sweeper's sampler: TPESampler(seed), defaults) is replayed many times, each trial's lr
answered by the nearest recorded lr (in log space): a breaking point is told PRUNED with its
baseline as its step-0 value, as the sweeper records it, with the `health_breach` constraint
(records/sweep.py BREACH_CONSTRAINT, what the sweeper does) or without it (what it did
before); a safe point is told one of its seed values drawn at random. Reported per arm: trials
sampled in the unsafe region (mean, sd over replays; RandomSampler as the floor) and the true mean (the landscape's) of the
best trial's lr. Caveat to state with the numbers: nearest-point answers make the landscape a
step function, so this measures the sampler's decisions on that landscape, not fresh training.
Writes bench/results/unsafe_<study>.json.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
from dataclasses import dataclass
from pathlib import Path

import optuna
from machine_info import machine  # bench/ is on the path: this runs as a script
from optuna.distributions import FloatDistribution

from records.sweep import BREACH_CONSTRAINT, TrialAttr, replicates
from sweeper.plan.breaches import AvoidsBreaches

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Point:
    lr: float
    breaks: bool  # a health rule pruned it
    values: tuple[float, ...]  # its completed seeds' objective values
    baseline: float | None

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values) if self.values else math.nan


def landscape(storage: str, study: str) -> list[Point]:
    s = optuna.load_study(study_name=study, storage=storage)
    points = []
    for t in s.get_trials(deepcopy=False):
        if t.state.name not in ("COMPLETE", "PRUNED"):
            continue
        values = tuple(r.value for r in replicates(t) if r.state == "COMPLETE")
        breaks = t.state.name == "PRUNED"
        baseline = t.user_attrs.get(TrialAttr.BASELINE)
        points.append(Point(t.params["lr"], breaks, () if breaks else values, baseline))
    return sorted(points, key=lambda p: p.lr)


def nearest(points: list[Point], lr: float) -> Point:
    return min(points, key=lambda p: abs(math.log(p.lr) - math.log(lr)))


def replay(
    points: list[Point],
    n_trials: int,
    seed: int,
    constrained: bool,
    tpe: bool,
    penalized: bool = False,
    avoid: bool = False,
) -> dict:
    """penalized: a breach is told COMPLETE with the worst value seen so far (the baseline
    before any) instead of PRUNED; avoid: TPE wrapped as the sweeper wraps it
    (sweeper/plan/breaches.py AvoidsBreaches: a proposal whose nearest finished trial breached is
    drawn again)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rng = random.Random(seed)
    sampler = optuna.samplers.TPESampler(seed=seed) if tpe else optuna.samplers.RandomSampler(seed)
    if avoid:
        sampler = AvoidsBreaches(sampler)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    space = {"lr": FloatDistribution(points[0].lr, points[-1].lr, log=True)}
    unsafe = 0
    for _ in range(n_trials):
        trial = study.ask(space)
        point = nearest(points, trial.params["lr"])
        if point.breaks:
            unsafe += 1
            if constrained:
                trial.set_constraint(BREACH_CONSTRAINT, 1.0)
            if penalized:
                seen = [t.value for t in study.trials if t.state.name == "COMPLETE"]
                trial.set_user_attr("breach", True)
                study.tell(trial, min(seen, default=point.baseline or 0.0))
                continue
            trial.set_user_attr(TrialAttr.PRUNE_REASON, {"rule": "recorded breach"})
            if point.baseline is not None:
                trial.report(point.baseline, 0)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, rng.choice(point.values))
    safe = [
        t for t in study.trials if t.state.name == "COMPLETE" and not t.user_attrs.get("breach")
    ]
    best = max(safe, key=lambda t: t.value, default=None)
    return {
        "unsafe_trials": unsafe,
        "best_lr": best.params["lr"] if best else None,
        "best_true_mean": nearest(points, best.params["lr"]).mean if best else None,
    }


def summary(rows: list[dict], key: str) -> dict:
    values = [r[key] for r in rows if r[key] is not None]
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--storage", default="sqlite:///sweeps.db")
    p.add_argument("--study", default="unsafe-landscape")
    p.add_argument("--landscape-from", help="a results JSON of this script (no study needed)")
    p.add_argument("--n-trials", type=int, default=20)
    p.add_argument("--repetitions", type=int, default=100)
    args = p.parse_args()
    if args.landscape_from:
        recorded = json.loads(Path(args.landscape_from).read_text())["landscape"]
        points = [Point(r["lr"], r["breaks"], tuple(r["values"]), r["baseline"]) for r in recorded]
    else:
        points = landscape(args.storage, args.study)
    safe = [pt for pt in points if not pt.breaks]
    best = max(safe, key=lambda pt: pt.mean)
    out = {
        "landscape": [pt.__dict__ | {"mean": pt.mean} for pt in points],
        "best_point": {"lr": best.lr, "mean": best.mean},
        "n_trials": args.n_trials,
        "repetitions": args.repetitions,
    }
    # random: how often the region is sampled by chance, the floor any learning should beat
    arms = (
        ("constraint", True, True, False, False),
        ("no_constraint", False, True, False, False),
        ("penalized_complete", True, True, True, False),
        ("avoid_nearest_breach", True, True, False, True),
        ("random", False, False, False, False),
    )
    for arm, constrained, tpe, penalized, avoid in arms:
        rows = [
            replay(points, args.n_trials, r, constrained, tpe, penalized, avoid)
            for r in range(args.repetitions)
        ]
        out[arm] = {
            "unsafe_trials": summary(rows, "unsafe_trials"),
            "best_true_mean": summary(rows, "best_true_mean"),
            "found_best_point_rate": sum(r["best_true_mean"] == best.mean for r in rows)
            / len(rows),
        }
    path = RESULTS / f"unsafe_{args.study}.json"
    path.write_text(json.dumps({**out, "machine": machine()}, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "landscape"}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
