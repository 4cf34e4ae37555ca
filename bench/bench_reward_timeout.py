"""What task.reward_timeout costs a step: scoring the tiny model's default step (batch_size=32
x group_size=8 = 256 completions) with the reward in process (timeout 0) and in the worker
process (timeout 5), alternated round by round (A B A B), medians and their ratio.

    python bench/bench_reward_timeout.py [--rounds 21] [--note TEXT]

The default task's reward (exact_match) never goes to the worker, so its step is the same code
with the timeout on or off; the cost shown is a user's `_target_` reward's (tests/user_rewards.py
`exact`, the same score), the worker's per-step IPC. Results: bench/results/reward_timeout.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

from machine_info import machine  # bench/ is on the path: this runs as a script

from trainer.env.rewards import score_batch
from trainer.env.tasks import make_task

RESULTS = Path(__file__).parent / "results"
STEP = 32 * 8  # the default batch_size x group_size


def task(timeout: float):
    sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(Path(__file__).parent.parent / "conf" / "task" / "addition.yaml")
    cfg.rewards = [{"_target_": "user_rewards.exact"}]
    cfg.reward_timeout = timeout
    return make_task(cfg)


def step_seconds(scoring, calls) -> float:
    started = time.perf_counter()
    score_batch(scoring, calls)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    in_process, in_worker = task(0), task(5)
    rng = random.Random(0)
    problems = in_process.train_problems(32, rng)
    calls = [(p, rng.choice([p.answer, "12", "1"]), True) for p in problems for _ in range(8)]
    same = score_batch(in_process, calls)[0] == score_batch(in_worker, calls)[0]  # warm both
    times: dict[str, list[float]] = {"in_process": [], "worker": []}
    for _ in range(args.rounds):
        times["in_process"].append(step_seconds(in_process, calls))
        times["worker"].append(step_seconds(in_worker, calls))
    medians = {k: statistics.median(v) for k, v in times.items()}
    quartiles = {k: statistics.quantiles(v, n=4) for k, v in times.items()}
    result = {
        "what": "seconds to score one default step (256 completions), one user reward",
        "same_scores": same,
        "rounds": args.rounds,
        "median_s": medians,
        "quartiles_s": quartiles,
        "overhead_ms_per_step": 1000 * (medians["worker"] - medians["in_process"]),
        "ratio": medians["worker"] / medians["in_process"],
        "machine": machine(args.note),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "reward_timeout.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=2))
    in_worker.rewards.worker.close()


if __name__ == "__main__":
    main()
