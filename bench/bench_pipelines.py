"""Pipelines on the same work: rollouts/s, sampler-vs-learner KL and held-out reward.

    python bench/bench_pipelines.py [--steps 40] [--rounds 2]

Runs sync, stream and async (max_steps_off_policy=2) in turn, `rounds` times (A B C A B C),
on the default config (32 problems x 8 rollouts, seed 0), and prints a Markdown table:
median rollouts/s over rounds, mean kl_sample_train_v2 over steps, async staleness, and the
final eval with its standard error. Results are recorded in bench/PIPELINES.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

import trainer  # noqa: F401  (registers the config schemas)
from trainer.run.train import train

CONF = str(Path(__file__).resolve().parents[1] / "conf")
PIPELINES = {
    "sync": ["pipeline=sync"],
    "stream": ["pipeline=stream", "num_minibatches=4"],
    "async": ["pipeline=async", "max_steps_off_policy=2"],
}


class Curve:
    """Every step's metrics and the wall-clock time it was reported at."""

    def __init__(self) -> None:
        self.steps: dict[int, dict[str, float]] = {}
        self.at: dict[int, float] = {}

    def report(self, step: int, metrics: dict[str, float]) -> None:
        self.steps[step] = dict(metrics)
        self.at[step] = time.perf_counter()


def run(overrides: list[str], steps: int) -> dict[str, float]:
    with (
        initialize_config_dir(config_dir=CONF, version_base="1.3"),
        tempfile.TemporaryDirectory() as out,
    ):
        cfg = compose("config", overrides=[f"output_dir={out}", f"max_steps={steps}", *overrides])
        curve = Curve()
        train(cfg, curve)
    trained = [m for s, m in curve.steps.items() if s > 1]  # the first step warms caches up
    # Wall clock between reports, eval steps left out: async samples while it trains, so
    # its own time/* metrics overlap and cannot be added up.
    timed = [s for s in range(2, steps + 1) if "eval/reward/mean" not in curve.steps[s]]
    seconds = sum(curve.at[s] - curve.at[s - 1] for s in timed)
    rollouts = len(timed) * len_rollouts(cfg)
    last = curve.steps[steps]
    return {
        "rollouts_per_s": rollouts / seconds,
        "kl_sample_train_v2": statistics.mean(m["kl_sample_train_v2"] for m in trained),
        "stale_mean": statistics.mean(m.get("async/stale_mean", 0.0) for m in trained),
        "discarded": sum(m.get("async/discarded", 0.0) for m in trained),
        "eval": last["eval/reward/mean"],
        "eval_se": last["eval/reward/stderr"],
    }


def len_rollouts(cfg) -> int:
    return (cfg.groups_per_batch or cfg.batch_size) * cfg.group_size


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    results: dict[str, list[dict[str, float]]] = {name: [] for name in PIPELINES}
    for _ in range(args.rounds):
        for name, overrides in PIPELINES.items():
            results[name].append(run(overrides, args.steps))
    print(
        "| pipeline | rollouts/s (median, per round) | mean kl_sample_train_v2 | async staleness (mean) / discarded | final eval +- stderr (per round) |"
    )
    print("|---|---|---|---|---|")
    for name, rows in results.items():
        speeds = [r["rollouts_per_s"] for r in rows]
        evals = ", ".join(f"{r['eval']:.3f} +- {r['eval_se']:.3f}" for r in rows)
        print(
            f"| {name} | {statistics.median(speeds):.0f} ({', '.join(f'{s:.0f}' for s in speeds)}) "
            f"| {statistics.mean(r['kl_sample_train_v2'] for r in rows):.2g} "
            f"| {statistics.mean(r['stale_mean'] for r in rows):.2f} / {sum(r['discarded'] for r in rows):.0f} "
            f"| {evals} |"
        )


if __name__ == "__main__":
    main()
