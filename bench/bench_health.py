"""Health-rule calibration: train a grid of settings once, keep every step's metrics, then
replay the pruning rules on the recorded curves (pruning only cuts a run short, and with the
same seed a run is the same up to the step it is cut, so a replay gives the pruned sweep's
trial-steps, time and winner exactly).

    python bench/bench_health.py record [--lrs ...] [--substeps ...] [--steps 50]
    python bench/bench_health.py replay [--curves bench/results/health_curves.json]

`record` writes bench/results/health_curves.json; `replay` prints the comparison recorded in
bench/HEALTH.md (pruning off vs the default rules).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from machine_info import machine  # bench/ is on the path: this runs as a script

import trainer  # noqa: F401  (registers the config schemas)
from trainer.rl.health import default_rules, replay
from trainer.run.train import train

CONF = str(Path(__file__).resolve().parents[1] / "conf")
CURVES = Path(__file__).resolve().parent / "results" / "health_curves.json"
EVAL = "eval/reward/mean"
MACHINE = "machine"  # not a run: {run: the machine it was recorded on}


class Curve:
    """Every step's metrics and the wall time spent up to and including it."""

    def __init__(self) -> None:
        self.steps: dict[int, dict[str, float]] = {}
        self.started = time.perf_counter()

    def report(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: (v if math.isfinite(v) else str(v)) for k, v in metrics.items()}
        self.steps[step] = {**clean, "time/elapsed_s": time.perf_counter() - self.started}


def record(
    lrs: list[float],
    substeps: list[int],
    steps: int,
    out: Path,
    seeds: tuple[int, ...] = (0,),
    overrides: tuple[str, ...] = (),
) -> None:
    """Train every lr x num_substeps x seed (with `overrides`, e.g. a model and task) and add
    its curve to `out` under `lr=... num_substeps=... [seed=...]`; runs already there are kept.
    The machine each run was recorded on (CPU, cores, package versions, the load average before
    and after) goes under the file's "machine" key."""
    runs = json.loads(out.read_text()) if out.exists() else {}
    machines = runs.pop(MACHINE, {})
    for seed in seeds:
        for n in substeps:
            for lr in lrs:
                key = f"lr={lr:g} num_substeps={n}" + (f" seed={seed}" if seed else "")
                if key in runs:
                    continue
                settings = [f"lr={lr}", f"num_substeps={n}", f"seed={seed}", *overrides]
                load_before = os.getloadavg()[0]
                curve = train_curve([*settings, f"max_steps={steps}"])
                runs[key] = {str(s): m for s, m in sorted(curve.steps.items())}
                machines[key] = machine(
                    f"shared host; 1-min load average {load_before:.1f} before the run, "
                    f"{os.getloadavg()[0]:.1f} after"
                )
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(as_lines({**runs, MACHINE: machines}))
                final = curve.steps[max(s for s in curve.steps if s >= 0)].get(EVAL)
                took = time.perf_counter() - curve.started
                print(f"{key}: final eval {final} in {took:.0f} s", flush=True)


def train_curve(overrides: list[str]) -> Curve:
    curve = Curve()
    with (
        initialize_config_dir(config_dir=CONF, version_base="1.3"),
        tempfile.TemporaryDirectory() as tmp,
    ):
        cfg = compose("config", overrides=[f"output_dir={tmp}", *overrides])
        try:
            train(cfg, curve)
        except FloatingPointError as e:  # a run that blew up: its curve ends there
            curve.steps.setdefault(-1, {"error": str(e)})
    return curve


def as_lines(runs: dict) -> str:
    """One run per line: small, and a diff shows which runs changed."""
    lines = [f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in runs.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def as_numbers(metrics: dict) -> dict[str, float]:
    return {
        k: float(v) for k, v in metrics.items() if isinstance(v, int | float | str) and k != "error"
    }


def load_runs(curves_path: Path) -> dict[str, dict]:
    """The recorded runs of a curves file, without its "machine" entry."""
    runs = json.loads(curves_path.read_text())
    runs.pop(MACHINE, None)
    return runs


def summarize(curves_path: Path, kl_threshold: float = 0.01) -> str:
    runs = load_runs(curves_path)
    rules = default_rules(kl_threshold)
    rows, total_off, total_on, time_off, time_on = [], 0, 0, 0.0, 0.0
    finals_off, finals_on = {}, {}
    for key, steps in runs.items():
        curve = {int(s): as_numbers(m) for s, m in steps.items() if int(s) >= 0}
        last = max(curve)
        breach = replay(rules, curve)
        stop = breach.step if breach else last
        evals = {s: m[EVAL] for s, m in curve.items() if EVAL in m}
        final = evals[max(evals)]
        total_off += last
        total_on += stop
        time_off += curve[last]["time/elapsed_s"]
        time_on += curve[stop]["time/elapsed_s"]
        finals_off[key] = final
        if breach is None:
            finals_on[key] = final
        peak_kl = max(m.get("kl_pre_post_v2", 0.0) for m in curve.values())
        rows.append(
            f"| {key} | {evals.get(0, float('nan')):.3f} | {final:.3f} | {peak_kl:.2g} | "
            + (f"{breach} |" if breach else "kept |")
        )
    best_off = max(finals_off, key=finals_off.get)
    best_on = max(finals_on, key=finals_on.get) if finals_on else "none"
    se = math.sqrt(finals_off[best_off] * (1 - finals_off[best_off]) / 400)
    lines = [
        "| run | eval at step 0 | final eval | peak kl_pre_post_v2 | default rules |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"trial-steps: {total_off} without pruning, {total_on} with the default rules "
        f"({100 * (1 - total_on / total_off):.0f}% fewer)",
        f"wall time: {time_off:.0f} s without pruning, {time_on:.0f} s with ({100 * (1 - time_on / time_off):.0f}% less)",
        f"best without pruning: {best_off} ({finals_off[best_off]:.3f} +- {se:.3f} stderr); "
        f"best with pruning: {best_on} ({finals_on.get(best_on, float('nan')):.3f})",
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record")
    r.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 2e-3, 5e-3, 1e-2, 3e-2])
    r.add_argument("--substeps", type=int, nargs="+", default=[1, 2, 4])
    r.add_argument("--steps", type=int, default=50)
    r.add_argument("--seeds", type=int, nargs="+", default=[0])
    r.add_argument("--curves", type=Path, default=CURVES)
    r.add_argument("overrides", nargs="*", help="config overrides, e.g. task=arithmetic")
    s = sub.add_parser("replay")
    s.add_argument("--curves", type=Path, default=CURVES)
    args = p.parse_args()
    if args.command == "record":
        record(
            args.lrs,
            args.substeps,
            args.steps,
            args.curves,
            tuple(args.seeds),
            tuple(args.overrides),
        )
    print(summarize(args.curves))


if __name__ == "__main__":
    main()
