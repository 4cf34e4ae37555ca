"""Trainer benchmark on the embedded tiny model: speed, memory, and held-out reward per lr.

    python bench/bench_trainer.py [--steps 50] [--lrs 1e-3 2e-3 4.3e-3 1e-2] [--out bench/results]

Writes a JSON line per run (and prints a Markdown table) with the median step time,
rollouts/s, peak resident memory and the eval curve. Results are recorded in bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import statistics
import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from machine_info import machine  # bench/ is on the path: this runs as a script

from trainer.run.train import train
from trainer.sampling.tiny_model import build_tiny_model, tiny_model_dir

CONF = str(Path(__file__).parents[1] / "conf")


class Recorder:
    def __init__(self) -> None:
        self.evals: dict[int, float] = {}
        self.step_s: list[float] = []
        self.rollouts_per_s: list[float] = []

    def report(self, step: int, metrics: dict[str, float]) -> None:
        if "eval/reward/mean" in metrics:
            self.evals[step] = round(metrics["eval/reward/mean"], 3)
        if "time/sample_s" in metrics:
            self.step_s.append(metrics["time/sample_s"] + metrics["time/train_s"])
            self.rollouts_per_s.append(metrics["throughput/rollouts_per_s"])


def run(overrides: list[str]) -> dict:
    with (
        initialize_config_dir(config_dir=CONF, version_base="1.3"),
        tempfile.TemporaryDirectory() as out,
    ):
        cfg = compose("config", overrides=[f"output_dir={out}", *overrides])
        recorder = Recorder()
        started = time.perf_counter()
        train(cfg, recorder)
        wall = time.perf_counter() - started
    return {
        "overrides": " ".join(overrides),
        "wall_s": round(wall, 1),
        "median_step_s": round(statistics.median(recorder.step_s), 4),
        "median_rollouts_per_s": round(statistics.median(recorder.rollouts_per_s)),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "evals": recorder.evals,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--lrs", nargs="+", default=["1e-3", "2e-3", "4.3e-3", "1e-2"])
    parser.add_argument("--out", default="bench/results.jsonl")
    args = parser.parse_args()
    logging.disable(logging.WARNING)

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        recipe = compose("config").model.tiny
    cached = (tiny_model_dir(recipe) / "recipe.json").exists()
    started = time.perf_counter()
    build_tiny_model(recipe)
    print(f"tiny model: {'cached' if cached else 'built'} in {time.perf_counter() - started:.1f}s")

    rows = [run([f"lr={lr}", f"max_steps={args.steps}"]) for lr in args.lrs]
    with open(args.out, "a") as f:
        for row in rows:
            f.write(json.dumps({**row, "machine": machine()}) + "\n")
    print("| overrides | wall s | step s (median) | rollouts/s | peak RSS MiB | eval by step |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        evals = " ".join(f"{s}:{v}" for s, v in r["evals"].items())
        print(
            f"| {r['overrides']} | {r['wall_s']} | {r['median_step_s']} | {r['median_rollouts_per_s']} | {r['peak_rss_mib']} | {evals} |"
        )


if __name__ == "__main__":
    main()
