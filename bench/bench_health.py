"""Health-rule calibration: train a grid of settings once, keep every step's metrics, then
replay the pruning rules on the recorded curves (pruning only cuts a run short, and with the
same seed a run is the same up to the step it is cut, so a replay gives the pruned sweep's
trial-steps, time and winner exactly).

    python bench/bench_health.py record [--lrs ...] [--substeps ...] [--steps 50]
    python bench/bench_health.py replay [--curves bench/results/health_curves.json ...]

`record` writes bench/results/health_curves.json; `replay` prints, per curves file (one sweep),
the comparison recorded in bench/HEALTH.md (pruning off vs the default rules: false positives,
trial-steps and time saved, net of the post-update KL's cost, and the warnings that fire).
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
from trainer.run.health import default_rules, failure_mode_rules, replay, warnings
from trainer.run.train import train

CONF = str(Path(__file__).resolve().parents[1] / "conf")
CURVES = Path(__file__).resolve().parent / "results" / "health_curves.json"
EVAL = "eval/reward/mean"
STDERR = "eval/reward/stderr"
POST_KL_S = "time/post_kl_s"
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


def final_eval(curve: dict[int, dict[str, float]], eval_size: int = 400) -> tuple[float, float]:
    """The run's last eval and its standard error (logged, else binomial over eval_size)."""
    step = max(s for s, m in curve.items() if EVAL in m)
    p = curve[step][EVAL]
    se = curve[step].get(STDERR)
    return p, se if se is not None else math.sqrt(max(p * (1 - p), 0.0) / eval_size)


def tied(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two final evals are within the 95% interval of their difference (unpaired)."""
    return abs(a[0] - b[0]) <= 1.96 * math.sqrt(a[1] ** 2 + b[1] ** 2)


def summarize(curves_path: Path, kl_threshold: float = 0.01) -> str:
    """The replay table and its totals for one curves file (one sweep): runs pruned, false
    positives (a pruned run whose final eval is the best or tied with it), trial-steps and
    wall time saved, that saving net of the post-update KL's forward (`time/post_kl_s`, which
    only the post_update_kl rule needs: a sweep without health rules can switch it off), and
    the warning rules that fire anywhere on the whole recorded curves."""
    runs = load_runs(curves_path)
    rules = default_rules(kl_threshold)
    rows, total_off, total_on, time_off, time_on = [], 0, 0, 0.0, 0.0
    post_kl_off, post_kl_on = 0.0, 0.0
    finals_off, finals_on, pruned, fired = {}, {}, {}, []
    for key, steps in runs.items():
        curve = {int(s): as_numbers(m) for s, m in steps.items() if int(s) >= 0}
        last = max(curve)
        breach = replay(rules, curve)
        stop = breach.step if breach else last
        evals = {s: m[EVAL] for s, m in curve.items() if EVAL in m}
        final = final_eval(curve)
        total_off += last
        total_on += stop
        time_off += curve[last]["time/elapsed_s"]
        time_on += curve[stop]["time/elapsed_s"]
        post_kl_off += sum(m.get(POST_KL_S, 0.0) for m in curve.values())
        post_kl_on += sum(m.get(POST_KL_S, 0.0) for s, m in curve.items() if s <= stop)
        finals_off[key] = final
        if breach is None:
            finals_on[key] = final
        else:
            pruned[key] = breach
        tag = f" (pruned at step {breach.step})" if breach else ""
        fired += [f"{key}{tag}: {w}" for w in warnings(failure_mode_rules(), curve)]
        peak_kl = max(m.get("kl_pre_post_v2", 0.0) for m in curve.values())
        rows.append(
            f"| {key} | {evals.get(0, float('nan')):.3f} | {final[0]:.3f} +- {final[1]:.3f} | "
            f"{peak_kl:.2g} | " + (f"{breach} |" if breach else "kept |")
        )
    best_off = max(finals_off, key=lambda k: finals_off[k][0])
    best_on = max(finals_on, key=lambda k: finals_on[k][0]) if finals_on else "none"
    false = [k for k in pruned if tied(finals_off[k], finals_off[best_off])]
    step_s = time_off / total_off  # the mean wall time of a trial-step without pruning
    net_s = (time_off - post_kl_off) - time_on
    lines = [
        "| run | eval at step 0 | final eval (+- stderr) | peak kl_pre_post_v2 | default rules |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"trial-steps: {total_off} without pruning, {total_on} with the default rules "
        f"({100 * (1 - total_on / total_off):.0f}% fewer)",
        f"wall time: {time_off:.0f} s without pruning, {time_on:.0f} s with ({100 * (1 - time_on / time_off):.0f}% less)",
        f"best without pruning: {best_off} ({finals_off[best_off][0]:.3f} +- "
        f"{finals_off[best_off][1]:.3f} stderr); best with pruning: {best_on} "
        f"({finals_on[best_on][0] if finals_on else float('nan'):.3f})",
        f"false positives: {len(false)} of {len(pruned)} pruned runs finished best or tied with "
        f"the best (95%, unpaired)" + (f": {', '.join(false)}" if false else ""),
    ]
    if post_kl_off > 0:
        lines.append(
            f"post-update KL's forward: {post_kl_off:.0f} s over every recorded step "
            f"({100 * post_kl_off / time_off:.0f}% of the wall time), {post_kl_on:.0f} s on the "
            f"steps run with the rules; net of it, pruning saves {net_s:.0f} s against a sweep "
            f"without rules and without the KL ({100 * net_s / time_off:.0f}%; "
            f"{net_s / step_s:.1f} of {total_off} trial-steps at {step_s:.3g} s a step)"
        )
    else:
        lines.append("post-update KL's forward: its time was not recorded in these curves")
    lines.append(
        "warnings on the whole curves: " + ("; ".join(fired) if fired else "none fire on any run")
    )
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
    s.add_argument("--curves", type=Path, nargs="+", default=[CURVES])
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
    for path in args.curves if args.command == "replay" else [args.curves]:
        print(f"## {path.name}\n\n{summarize(path)}\n")


if __name__ == "__main__":
    main()
