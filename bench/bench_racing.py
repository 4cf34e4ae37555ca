"""Racing seeds against fixed seeds, replayed from per-seed results recorded once.

    python -m sweeper -m lr=1e-3,2e-3,3e-3,5e-3,8e-3 hydra.sweeper.seeds=8 max_steps=20 \
        batch_size=8 group_size=4 eval_every=0 hydra.sweeper.health=[] \
        hydra.sweeper.study_name=racing-truth                      # the truth: 8 seeds each
    python bench/bench_racing.py --storage sqlite:///sweeps.db --study racing-truth

A configuration's seed is one draw of its objective, so a sweep with seeds=auto (or fixed
seeds=5) is replayed by drawing, for each configuration, its seeds in a random order from the
recorded ones (without replacement) and running the race exactly as sweeper/sweep/loop.py does
with one lane (sweeper/sweep/racing.py decides; analysis/verdict.py judges). Repetitions share the
recorded pool, so they are not independent draws of new training runs: say so with the numbers.
Writes bench/results/racing_<study>.json.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections import deque
from pathlib import Path

import optuna

from analysis import records
from analysis.stats import MIN_SEEDS
from analysis.verdict import Config, Seed, verdict
from sweeper.sweep.racing import HOLD, SEED, STOP, Entry, decide
from trainer.rl.rl_math import mean_and_stderr

RESULTS = Path(__file__).resolve().parent / "results"


def recorded_values(storage: str, study: str) -> dict[str, list[float]]:
    """{configuration label: its completed seed values} from the truth study."""
    s = optuna.load_study(study_name=study, storage=storage)
    out = {}
    for t in s.get_trials(deepcopy=False):
        values = [r.value for r in records.replicates(t) if r.state == "COMPLETE"]
        if len(values) >= 5:
            out[f"lr={t.params['lr']:g}"] = values
    return out


def race(draws: dict[str, list[float]], max_seeds: int) -> dict[str, list[float]]:
    """One grid sweep with seeds=auto and one lane: the values each configuration got."""
    got: dict[str, list[float]] = {c: [] for c in draws}
    queue, pending, held, open_ = deque(draws), deque(), set(), set()

    def settle(c: str) -> None:
        others = [Entry(o, tuple(v)) for o, v in got.items() if o != c and v]
        to_come = bool(queue) or any(len(got[o]) < MIN_SEEDS for o in open_ if o != c)
        step = decide(Entry(c, tuple(got[c])), others, max_seeds, True, to_come, len(draws))
        held.discard(c)
        if step.action == SEED:
            pending.appendleft(c)
        elif step.action == HOLD:
            held.add(c)
        elif step.action == STOP:
            open_.discard(c)
            for h in list(held):
                settle(h)

    while True:
        if pending:
            c = pending.popleft()
            got[c].append(draws[c][len(got[c])])
            if c not in pending:  # all its started seeds ended
                settle(c)
        elif queue:
            c = queue.popleft()
            open_.add(c)
            pending.extend([c] * MIN_SEEDS)
        elif held:
            for h in list(held):
                settle(h)
        else:
            return got


def judged(got: dict[str, list[float]], max_seeds: int | None):
    configs = [
        Config(c, {}, tuple(Seed(i, v, None) for i, v in enumerate(vs))) for c, vs in got.items()
    ]
    return verdict(configs, True, max_seeds)


def truth_ties(values: dict[str, list[float]]) -> set[frozenset]:
    """Pairs the truth calls tied: their means within 2 standard errors of the difference."""
    ties = set()
    for a in values:
        for b in values:
            (mean_a, se_a), (mean_b, se_b) = mean_and_stderr(values[a]), mean_and_stderr(values[b])
            if a < b and abs(mean_a - mean_b) < 2 * math.hypot(se_a, se_b):
                ties.add(frozenset((a, b)))
    return ties


def run(values: dict[str, list[float]], repetitions: int, max_seeds: int, seed: int) -> dict:
    rng = random.Random(seed)
    ties = truth_ties(values)
    means = {c: sum(v) / len(v) for c, v in values.items()}
    truth_best = max(means, key=means.get)
    rows = []
    for _ in range(repetitions):
        draws = {c: rng.sample(v, len(v)) for c, v in values.items()}
        raced = judged(race(draws, max_seeds), max_seeds)
        fixed = judged({c: d[:max_seeds] for c, d in draws.items()}, None)
        best = raced.best.label
        decided = [s.label for s in raced.ranked[1:] if s.label not in raced.tied_with_best]
        fixed_best = fixed.best.label
        fixed_decided = [s.label for s in fixed.ranked[1:] if s.label not in fixed.tied_with_best]
        rows.append(
            {
                "runs": sum(len(s.config.seeds) for s in raced.ranked),
                "winner": best,
                "fixed_winner": fixed.best.label,
                "same_winner": best == fixed.best.label,
                "same_or_tied": fixed.best.label in (best, *raced.tied_with_best),
                "decided_against_truth_tie": sum(frozenset((best, o)) in ties for o in decided),
                "decided_pairs_truth_ties": [o for o in decided if frozenset((best, o)) in ties],
                "fixed_decided_against_truth_tie": sum(
                    frozenset((fixed_best, o)) in ties for o in fixed_decided
                ),
                "race": {s.label: len(s.config.seeds) for s in raced.ranked},
            }
        )
    runs = [r["runs"] for r in rows]
    mean_runs = sum(runs) / len(runs)
    return {
        "truth": {c: {"mean": means[c], "seeds": len(v), "values": v} for c, v in values.items()},
        "truth_best": truth_best,
        "truth_ties": sorted(sorted(p) for p in ties),
        "within_2se_of_best": sorted(
            c for c in values if c == truth_best or frozenset((c, truth_best)) in ties
        ),
        "repetitions": repetitions,
        "max_seeds": max_seeds,
        "fixed_runs": max_seeds * len(values),
        "raced_runs_mean": mean_runs,
        "raced_runs_sd": (sum((r - mean_runs) ** 2 for r in runs) / (len(runs) - 1)) ** 0.5,
        "raced_runs_range": [min(runs), max(runs)],
        "same_winner_rate": sum(r["same_winner"] for r in rows) / len(rows),
        "same_winner_or_tied_rate": sum(r["same_or_tied"] for r in rows) / len(rows),
        "decided_against_truth_tie": sum(r["decided_against_truth_tie"] for r in rows),
        "fixed_decided_against_truth_tie": sum(r["fixed_decided_against_truth_tie"] for r in rows),
        "rows": rows,
    }


def repeated(values: dict[str, list[float]], repetitions: int, max_seeds: int, seeds) -> dict:
    """`run` once per replay seed: each seed's summary, and the spread across them."""
    per_seed = [run(values, repetitions, max_seeds, seed) | {"seed": seed} for seed in seeds]
    out = {k: v for k, v in per_seed[0].items() if k not in SUMMARY + ("rows", "seed")}
    out["by_seed"] = [{k: r[k] for k in ("seed", *SUMMARY)} for r in per_seed]
    ratios = [r["fixed_runs"] / r["raced_runs_mean"] for r in per_seed]
    out["runs_ratio_by_seed"] = ratios
    for key in ("decided_against_truth_tie", "fixed_decided_against_truth_tie"):
        out[f"{key}_total"] = sum(r[key] for r in per_seed)
    out["rows"] = [row | {"seed": r["seed"]} for r in per_seed for row in r["rows"]]
    return out


SUMMARY = (
    "raced_runs_mean",
    "raced_runs_sd",
    "raced_runs_range",
    "same_winner_rate",
    "same_winner_or_tied_rate",
    "decided_against_truth_tie",
    "fixed_decided_against_truth_tie",
)


def values_from_results(path: str) -> dict[str, list[float]]:
    """The truth's per-seed values as an earlier run of this script recorded them."""
    truth = json.loads(Path(path).read_text())["truth"]
    return {c: t["values"] for c, t in truth.items()}


def dumped(out: dict) -> str:
    """The results as JSON, one replay per line (thousands of them)."""
    head = json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=1)
    rows = ",\n".join(f"  {json.dumps(r)}" for r in out["rows"])
    return f'{head[:-2]},\n "rows": [\n{rows}\n ]\n}}\n'


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--storage", default="sqlite:///sweeps.db")
    p.add_argument("--study", default="racing-truth")
    p.add_argument(
        "--values-from",
        help="replay the truth recorded in this results JSON (no study needed), e.g. "
        "bench/results/racing_racing-truth.json",
    )
    p.add_argument("--repetitions", type=int, default=200)
    p.add_argument("--max-seeds", type=int, default=5)
    p.add_argument("--seed", type=int, nargs="+", default=[0, 1, 2])
    args = p.parse_args()
    if args.values_from:
        values = values_from_results(args.values_from)
    else:
        values = recorded_values(args.storage, args.study)
    out = repeated(values, args.repetitions, args.max_seeds, args.seed)
    path = RESULTS / f"racing_{args.study}.json"
    path.write_text(dumped(out))
    shown = {k: v for k, v in out.items() if k not in ("rows", "truth")}
    print(json.dumps(shown, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
