"""Drawing one token a row: torch.multinomial against the inverse-CDF draw the sampler uses
for wide vocabularies (trainer/sampling/torch_sampler.py `draw`), alternated A B A B.

    python bench/bench_draw.py            # 32 rows x 49,152 tokens (SmolLM2), 2 threads

Per round: the median over 50 draws of each; printed and written to
bench/results/draw.json. Nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from machine_info import machine  # bench/ is on the path: this runs as a script

from trainer.sampling.torch_sampler import draw

RESULTS = Path(__file__).parent / "results"


def median_ms(fn, probs: torch.Tensor, draws: int) -> float:
    fn(probs)  # warm
    times = []
    for _ in range(draws):
        started = time.perf_counter()
        fn(probs)
        times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=49_152)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(args.rows, args.vocab), dim=-1)
    arms = {"multinomial": lambda p: torch.multinomial(p, 1)[:, 0], "inverse_cdf": draw}
    rounds = {name: [] for name in arms}
    for _ in range(args.rounds):
        for name, fn in arms.items():
            rounds[name].append(median_ms(fn, probs, 50))
    result = {
        "shape": [args.rows, args.vocab],
        "threads": args.threads,
        "machine": machine(),
        "ms_per_draw_by_round": rounds,
        "median_ms": {name: statistics.median(v) for name, v in rounds.items()},
    }
    result["ratio"] = result["median_ms"]["multinomial"] / result["median_ms"]["inverse_cdf"]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "draw.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
