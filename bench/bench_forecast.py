"""Objective pruners replayed on recorded curves (bench_health.py's JSON): trial-steps saved
and whether the best configuration (or one tied with it) survives, for no pruning, Optuna's
median and hyperband pruners (the real ones, fed the recorded evals through ask/tell) and the
forecasting pruner (judge/forecast.py, as sweeper/sweep/job.py calls it).

    python bench/bench_forecast.py bench/results/health_curves.json [more curves ...]

Each file is one sweep, its runs in `--orders` random orders (sequential, one job: a run's
incumbent is the best run completed before it). Writes bench/results/forecast_replay_level<L>.json,
or `--out NAME` there (e.g. a held-out real-model replay beside the tiny model's).

    python bench/bench_forecast.py --calibrate bench/results/health_curves.json
    python bench/bench_forecast.py --coverage bench/results/health_curves*.json

--calibrate prints judge/forecast.py's MODEL_ERROR from the calibration curves: at each
level the conformal quantile (rank ceil((n + 1) L)) of (final - bound) / horizon over every
forecast of a run that did not collapse (a collapsed run is covered trivially). --coverage
writes bench/results/forecast_coverage.json: per file, level and variant, how many of those
forecasts' optimistic bounds lay at or above the run's final value.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

import optuna

from judge import forecast

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


def library_sweeps(folder: Path, part: str | None, every: int) -> dict[str, dict]:
    """The recorded-curve library (bench/record_curves.py) as sweeps: one a (model, task,
    seed), its runs the lrs, each its held-out metric's evals at a multiple of `every`."""
    from analysis.rule_replay import at_cadence, eval_stderr, load_library

    sweeps: dict[str, dict] = {}
    for run in load_library([folder], part):
        model_task, lr, seed = run.run.rsplit("-", 2)
        points = [
            (s, m[run.heldout_metric], eval_stderr(run, m))
            for s, m in sorted(at_cadence(run.steps, every).items())
            if isinstance(m.get(run.heldout_metric), int | float)
        ]
        sweeps.setdefault(f"{model_task}-{seed}", {})[lr] = points
    return sweeps


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
            for i in range(forecast.MIN_POINTS, len(points)):
                steps, values, ses = zip(*points[:i], strict=True)
                fc = forecast.forecast(steps, values, ses, last, level)
                if fc is not None and forecast.cannot_win(fc, low):
                    stop = steps[-1]
                    break
        stopped[key] = stop
        if stop == last:
            done.append(points[-1])
    return stopped


LEVELS = (0.5, 0.75, 0.9, 0.95)
# (name, models, eval points before a forecast counts, conformal correction)
VARIANTS = (
    ("flat+power, noise only, from 2 points (before)", ("flat", "power"), 2, False),
    ("flat+power, noise only, from 3 points", ("flat", "power"), 3, False),
    ("flat+power+linear, noise only, from 3 points", ("flat", "power", "linear"), 3, False),
    ("flat+power+linear + conformal, from 3 points", ("flat", "power", "linear"), 3, True),
    ("flat+power+linear+peak + conformal, from 3 points (now)", forecast.OPTIMISTIC, 3, True),
)


def collapsed(points) -> bool:
    """A run that ended below its baseline by more than 2 final stderrs."""
    return points[-1][1] < points[0][1] - 2 * points[-1][2]


def forecasts(curves, level: float, models, min_points: int, corrected: bool):
    """(final, bound, horizon) for every forecast of every run that did not collapse, made
    from its first i >= min_points evals before the last."""
    out = []
    for points in curves.values():
        if collapsed(points):
            continue
        last, final = points[-1][0], points[-1][1]
        for i in range(min_points, len(points)):
            steps, values, ses = zip(*points[:i], strict=True)
            fc = forecast.forecast(steps, values, ses, last, level, 0, models, corrected)
            out.append((final, fc.high, (last - steps[-1]) / last))
    return out


def calibrate(curves) -> dict[float, float]:
    """MODEL_ERROR: at each level the conformal quantile of (final - bound) / horizon."""
    out = {}
    for level in LEVELS:
        got = forecasts(curves, level, VARIANTS[-1][1], VARIANTS[-1][2], False)
        scores = sorted((final - high) / h for final, high, h in got)
        rank = min(math.ceil((len(scores) + 1) * level), len(scores)) - 1
        out[level] = round(max(scores[rank], 0.0), 4)
    return out


def coverage(curves, variants=VARIANTS) -> dict:
    out = {}
    for level in LEVELS:
        out[str(level)] = {}
        for name, models, points, corrected in variants:
            got = forecasts(curves, level, models, points, corrected)
            out[str(level)][name] = [int(sum(high >= final for final, high, _ in got)), len(got)]
    return out


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
    p.add_argument("curves", type=Path, nargs="*")
    p.add_argument("--library", type=Path, help="a recorded-curve library folder instead")
    p.add_argument("--part", choices=["calibration", "heldout"], help="the library's part")
    p.add_argument("--every", type=int, default=10, help="the library's evals replayed")
    p.add_argument("--eval-size", type=int, default=400)
    p.add_argument("--orders", type=int, default=20)
    p.add_argument("--level", type=float, default=0.9)
    p.add_argument("--out", help="file name under bench/results (default: by level)")
    p.add_argument("--calibrate", action="store_true", help="print MODEL_ERROR from the curves")
    p.add_argument("--coverage", action="store_true", help="write forecast_coverage.json")
    p.add_argument("--last", type=int, default=len(VARIANTS), help="--coverage: last N variants")
    args = p.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sizes = {"smollm2": 64}  # eval problems where a file's curves logged none
    load = {
        path: eval_curves(
            path, next((n for k, n in sizes.items() if k in path.name), args.eval_size)
        )
        for path in args.curves
    }
    if args.library:  # each (model, task, seed) a sweep over its lrs
        for name, runs in library_sweeps(args.library, args.part, args.every).items():
            load[Path(name)] = runs
    if args.calibrate:
        merged = {f"{p.name} {k}": c for p, curves in load.items() for k, c in curves.items()}
        print(f"MODEL_ERROR = {calibrate(merged)}")
        return
    if args.coverage:
        out = {p.name: coverage(curves, VARIANTS[-args.last :]) for p, curves in load.items()}
        for name, by_level in out.items():
            for level, rows in by_level.items():
                for variant, (hit, n) in rows.items():
                    print(f"{name} {level} {variant}: {hit}/{n}")
        (RESULTS / (args.out or "forecast_coverage.json")).write_text(
            json.dumps(out, indent=1) + "\n"
        )
        return
    out = {}
    for path, curves in load.items():
        tied = tied_with_best(curves)
        best = max(curves, key=lambda k: curves[k][-1][1])
        total = sum(c[-1][0] for c in curves.values())
        rows = {}
        for arm in ("none", "median", "hyperband", "forecast"):
            steps, survived, strict = [], 0, 0
            for seed in range(args.orders):
                order = list(curves)
                random.Random(seed).shuffle(order)
                stopped = replay(curves, order, arm, args.level)
                steps.append(sum(stopped.values()))
                survived += any(stopped[k] == curves[k][-1][0] for k in tied)
                strict += stopped[best] == curves[best][-1][0]
            mean = sum(steps) / len(steps)
            sd = math.sqrt(sum((s - mean) ** 2 for s in steps) / max(len(steps) - 1, 1))
            rows[arm] = {
                "trial_steps": mean,
                "trial_steps_sd": sd,
                "saved": total - mean,
                "best_survival": survived / args.orders,
                "strict_best_survival": strict / args.orders,
            }
            print(
                f"{path.name} {arm:9s} trial-steps {mean:6.1f} (sd {sd:5.1f}) saved "
                f"{total - mean:6.1f} of {total}, best (or tied) survives "
                f"{survived}/{args.orders}, strict best {strict}/{args.orders}"
            )
        out[path.name] = {"tied_with_best": sorted(tied), "total": total, "arms": rows}
    (RESULTS / (args.out or f"forecast_replay_level{args.level:g}.json")).write_text(
        json.dumps(out, indent=1) + "\n"
    )


if __name__ == "__main__":
    main()
