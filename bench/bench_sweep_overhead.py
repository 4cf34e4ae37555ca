"""What a sweep costs beyond training: sweep wall time minus the trainer's own time.

    python bench/bench_sweep_overhead.py [--small 2] [--large 6] [--steps 20] [--repeats 2]

A sweep of N lr values (one trial at a time, the default stores: SQLite Optuna study and
MLflow store in a fresh directory) runs `python -m sweeper -m` in a subprocess; the same trial
configs then run through `trainer.run.train.train` in one warm process, with no sweep around them.
A sweep's overhead is its wall time minus the sum of those trainer times: process start and
imports, Hydra, Optuna storage, MLflow logging, health checks, model loads. Two sweep sizes
separate the once-per-sweep part (start-up) from the per-trial part:
    per trial = (overhead(large) - overhead(small)) / (large - small)
    once      = overhead(small) - small * per trial
Alternated sweep, trainer, sweep, trainer. Results: bench/results/sweep_overhead.json.
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


def lrs(trials: int) -> list[str]:
    return [f"{1e-3 * (i + 1):g}" for i in range(trials)]


def sweep_wall(trials: int, steps: int) -> float:
    with tempfile.TemporaryDirectory() as cwd:
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{cwd}/mlflow.db"}
        args = [f"lr={','.join(lrs(trials))}", f"max_steps={steps}", "hydra.sweeper.n_jobs=1"]
        args += ["hydra.sweeper.seeds=1"]  # one run a trial: the overhead is per run
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "sweeper", "-m", *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"sweep failed:\n{done.stderr[-3000:]}")
    return wall


def trainer_times(trials: int, steps: int) -> list[float]:
    """Each trial's config through train() in this warm process (no sweep, no MLflow)."""
    import logging

    from hydra import compose, initialize_config_dir

    from trainer.base.config import config_dir
    from trainer.run.train import train

    logging.disable(logging.WARNING)
    times = []
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        for lr in lrs(trials):
            with tempfile.TemporaryDirectory() as out:
                cfg = compose(
                    "config", overrides=[f"output_dir={out}", f"lr={lr}", f"max_steps={steps}"]
                )
                started = time.perf_counter()
                train(cfg)
                times.append(time.perf_counter() - started)
    return times


def overhead(trials: int, steps: int) -> tuple[float, list[float]]:
    wall = sweep_wall(trials, steps)
    own = trainer_times(trials, steps)
    return wall - sum(own), own


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=2)
    parser.add_argument("--large", type=int, default=6)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    trainer_times(1, 2)  # warm this process (imports, the tiny model's cache) once
    rows = []
    for repeat in range(args.repeats):
        small, own_small = overhead(args.small, args.steps)
        large, own_large = overhead(args.large, args.steps)
        per_trial = (large - small) / (args.large - args.small)
        trial_s = statistics.median(own_small + own_large)
        row = {
            "overhead_small_s": round(small, 2),
            "overhead_large_s": round(large, 2),
            "trainer_s_median": round(trial_s, 2),
            "per_trial_s": round(per_trial, 3),
            "per_trial_pct": round(100 * per_trial / trial_s, 1),
            "once_per_sweep_s": round(small - args.small * per_trial, 2),
        }
        rows.append(row)
        print(f"[{repeat + 1}/{args.repeats}] {json.dumps(row)}", flush=True)
    report = {
        "sweeps": [args.small, args.large],
        "steps": args.steps,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "runs": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sweep_overhead.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
