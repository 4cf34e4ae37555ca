"""Objective pruners replayed on recorded curves (bench_health.py's JSON): trial-steps saved
and whether the best configuration (or one tied with it) survives, for no pruning, Optuna's
median and hyperband pruners (the real ones, fed the recorded evals through ask/tell) and the
forecasting pruner (analysis/forecast.py, as sweeper/sweep/job.py calls it).

    python bench/bench_forecast.py bench/results/health_curves.json [more curves ...]

Each file is one sweep, its runs in `--orders` random orders (sequential, one job: a run's
incumbent is the best run completed before it). Writes bench/results/forecast_replay_level<L>.json,
or `--out NAME` there (e.g. a held-out real-model replay beside the tiny model's).
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

import optuna

from analysis import forecast

EVAL = "eval/reward/mean"
RESULTS = Path(__file__).resolve().parent / "results"


def eval_curves(path: Path, eval_size: int) -> dict[str, list[tuple[int, float, float]]]:
    """{run: [(step, eval, stderr)]}; stderr binomial over eval_size problems when not logged."""
    curves = {}
    for key, steps in json.loads(path.read_text()).items():
        if key == "machine":  # not a run: the machine each run was recorded on
            continue
        points = []
        for s, m in sorted(steps.items(), key=lambda x: int(x[0])):
            if int(s) >= 0 and isinstance(m.get(EVAL), int | float):
                p = m[EVAL]
                se = m.get("eval/reward/stderr") or math.sqrt(max(p * (1 - p), 0.0) / eval_size)
                points.append((int(s), p, se))
        curves[key] = points
    return curves


def replay(curves, order, arm: str, level: float) -> dict[str, int]:
    """{run: the step it stopped at} for one sweep in `order`."""
    if arm in ("median", "hyperband"):
        pruner = (
            optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1)
            if arm == "median"
            else optuna.pruners.HyperbandPruner(min_resource=1)
        )
        study = optuna.create_study(direction="maximize", pruner=pruner)
    stopped, done = {}, []
    for key in order:
        points = curves[key]
        last = points[-1][0]
        stop = last
        if arm in ("median", "hyperband"):
            trial = study.ask()
            for step, value, _ in points:
                trial.report(value, step)
                if step < last and trial.should_prune():
                    stop = step
                    break
            if stop < last:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            else:
                study.tell(trial, points[-1][1])
        elif arm == "forecast" and done:
            best = max(done, key=lambda p: p[1])
            low = forecast.incumbent_low(best[1], best[2], level)
            for i in range(2, len(points)):
                steps, values, ses = zip(*points[:i], strict=True)
                fc = forecast.forecast(steps, values, ses, last, level)
                if fc is not None and forecast.cannot_win(fc, low):
                    stop = steps[-1]
                    break
        stopped[key] = stop
        if stop == last:
            done.append(points[-1])
    return stopped


def tied_with_best(curves) -> set[str]:
    """Runs whose final eval the verdict could not separate from the best (95%, unpaired)."""
    finals = {k: c[-1] for k, c in curves.items()}
    best = max(finals.values(), key=lambda p: p[1])
    return {
        k
        for k, (_, v, se) in finals.items()
        if best[1] - v <= 1.96 * math.sqrt(se**2 + best[2] ** 2)
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("curves", type=Path, nargs="+")
    p.add_argument("--eval-size", type=int, default=400)
    p.add_argument("--orders", type=int, default=20)
    p.add_argument("--level", type=float, default=0.9)
    p.add_argument("--out", help="file name under bench/results (default: by level)")
    args = p.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out = {}
    for path in args.curves:
        curves = eval_curves(path, args.eval_size)
        tied = tied_with_best(curves)
        total = sum(c[-1][0] for c in curves.values())
        rows = {}
        for arm in ("none", "median", "hyperband", "forecast"):
            steps, survived = [], 0
            for seed in range(args.orders):
                order = list(curves)
                random.Random(seed).shuffle(order)
                stopped = replay(curves, order, arm, args.level)
                steps.append(sum(stopped.values()))
                survived += any(stopped[k] == curves[k][-1][0] for k in tied)
            mean = sum(steps) / len(steps)
            sd = math.sqrt(sum((s - mean) ** 2 for s in steps) / max(len(steps) - 1, 1))
            rows[arm] = {
                "trial_steps": mean,
                "trial_steps_sd": sd,
                "saved": total - mean,
                "best_survival": survived / args.orders,
            }
            print(
                f"{path.name} {arm:9s} trial-steps {mean:6.1f} (sd {sd:5.1f}) saved "
                f"{total - mean:6.1f} of {total}, best (or tied) survives "
                f"{survived}/{args.orders}"
            )
        out[path.name] = {"tied_with_best": sorted(tied), "total": total, "arms": rows}
    (RESULTS / (args.out or f"forecast_replay_level{args.level:g}.json")).write_text(
        json.dumps(out, indent=1) + "\n"
    )


if __name__ == "__main__":
    main()
