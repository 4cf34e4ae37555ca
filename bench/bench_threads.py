"""A training step's time at 1 thread, every core and `model.threads=auto`, quiet and beside busy
processes, on the tiny model and on SmolLM2-135M, alternated.

    python tests/real_model.py                   # builds SmolLM2 once
    python bench/bench_threads.py --rounds 5 --note "quiet"   # bench/results/threads.json

Each run is `python -m trainer` in a fresh process and directory, with `model.threads` set to
the arm's value. A background load is N processes that spin in pure Python, each
started before the run and killed after it. Within a round, every model and load runs every
arm, in an order rotated each round (A B C, B C A, ...), so a drift of the host's speed falls on
all arms alike. Per run: the whole command's wall time and the median of its training steps
(`time/sample_s + time/train_s` from the run's MLflow metrics, the first step left out). Nothing
asserts a timing; THREADS.md quotes the medians and spreads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine_info import machine  # bench/ is on the path: this runs as a script

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parents[1]
# Spins in pure Python until its parent is gone, so a killed bench leaves no load behind.
SPIN = "import os\nparent = os.getppid()\nwhile os.getppid() == parent: pass"
MODELS = {
    "tiny": ["max_steps=30", "eval_every=0"],
    "smollm2": [
        *("max_steps=4", "batch_size=4", "group_size=4", "max_tokens=16", "eval_every=0"),
        "task.eval_size=16",  # the baseline and final evals: a step's work, not a run's
    ],
}


def model_args(name: str) -> list[str]:
    if name != "smollm2":
        return MODELS[name]
    sys.path.insert(0, str(ROOT / "tests"))
    from real_model import smollm2_dir

    return [f"model.path={smollm2_dir()}", *MODELS[name]]


def step_seconds(tracking: str) -> list[float]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking)
    (run,) = client.search_runs(client.search_experiments()[0].experiment_id.split())
    series = {}
    for key in ("time/sample_s", "time/train_s"):
        for m in client.get_metric_history(run.info.run_id, key):
            series.setdefault(m.step, 0.0)
            series[m.step] += m.value
    return [series[s] for s in sorted(series)][1:]  # the first step warms caches up


def one_run(model: str, arm: str, load: int) -> dict:
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(load)]
    try:
        with tempfile.TemporaryDirectory() as scratch:
            tracking = f"sqlite:///{scratch}/mlflow.db"
            env = {**os.environ, "MLFLOW_TRACKING_URI": tracking}
            env.pop("OMP_NUM_THREADS", None)  # the arm decides
            command = [sys.executable, "-m", "trainer", f"model.threads={arm}"]
            command += [*model_args(model), f"hydra.run.dir={scratch}/out"]
            start = time.perf_counter()
            done = subprocess.run(command, cwd=scratch, env=env, capture_output=True, text=True)
            wall = time.perf_counter() - start
            if done.returncode != 0:
                raise RuntimeError(f"{model} {arm}: {done.stderr[-2000:]}")
            chosen = next(
                line.split("CPU threads: ")[1]
                for line in (done.stdout + done.stderr).splitlines()
                if "CPU threads: " in line
            )
            steps = step_seconds(tracking)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    return {"wall_s": wall, "step_s": statistics.median(steps), "chosen": chosen}


def summary(runs: list[dict], key: str) -> dict:
    values = sorted(r[key] for r in runs)
    return {"median": statistics.median(values), "min": values[0], "max": values[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"])
    parser.add_argument("--loads", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=["1", str(os.cpu_count()), "auto"])
    parser.add_argument("--out", default=str(RESULTS / "threads.json"))
    parser.add_argument("--note", default="", help="how the host was used beside the bench")
    args = parser.parse_args()
    cells: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        for model in args.models:
            for load in args.loads:
                k = r % len(args.arms)
                for arm in args.arms[k:] + args.arms[:k]:
                    run = one_run(model, arm, load)
                    cells.setdefault(f"{model} load={load} threads={arm}", []).append(run)
                    print(f"round {r} {model} load={load} threads={arm}: {run}", flush=True)
    table = {
        name: {
            "runs": len(runs),
            "wall_s": summary(runs, "wall_s"),
            "step_s": summary(runs, "step_s"),
            "chosen": sorted({r["chosen"] for r in runs}),
        }
        for name, runs in cells.items()
    }
    result = {"machine": machine(args.note), "rounds": args.rounds, "cells": table, "raw": cells}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for name, cell in table.items():
        s, w = cell["step_s"], cell["wall_s"]
        print(
            f"{name:34s} step {s['median']:.4f} s [{s['min']:.4f}, {s['max']:.4f}]  "
            f"wall {w['median']:.1f} s [{w['min']:.1f}, {w['max']:.1f}]  {cell['chosen']}"
        )


if __name__ == "__main__":
    main()
