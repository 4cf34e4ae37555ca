"""Peak memory and step time of our trainer on the real model, SmolLM2-135M-Instruct.

    python tests/real_model.py                       # builds the model directory once
    python bench/bench_real_model.py --values 1024 4096 16384 --rounds 2
    python bench/bench_real_model.py --key gradient_checkpointing --values false true

Each run is its own process (so its peak RSS is its own): `batch_size=32 group_size=8
max_tokens=64` (the default batch shape) on the arithmetic questions in
bench/arithmetic.jsonl (`task=jsonl`, prompts as plain text: not chat-rendered), LoRA r8 on
every linear layer, fp32, torch on --threads threads, --steps steps. Runs alternate over the
values of --key, --rounds times. Per run: the median step time (the first step excluded), the
split (sampling, the learner's forward+backward, the optimizer, the post-update KL, the
reference with --extra kl_penalty_coef=...), and peak RSS. Nothing asserts a timing; results go
to bench/results/real_model_<key>.json and BENCHMARKS.md. The model is a dequantized Q4_1 copy,
not the released bf16 weights (tests/real_model.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
QUESTIONS = Path(__file__).parent / "arithmetic.jsonl"
SHAPE = ["batch_size=32", "group_size=8", "max_tokens=64"]
SPLITS = {
    "sample": "time/sample_s",
    "forward_backward": "time/forward_backward_s",
    "optimizer": "time/optimizer_s",
    "post_kl": "time/post_kl_s",
    "reference": "time/reference_s",
}


def write_questions(path: Path = QUESTIONS, rows: int = 1000, seed: int = 0) -> Path:
    """Plain arithmetic questions, {"prompt", "answer"} rows: the real-model benchmarks' task."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(rows):
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            op = rng.choice("+-*")
            answer = a + b if op == "+" else a - b if op == "-" else a * b
            prompt = f"What is {a} {op} {b}? Answer with the number only."
            f.write(json.dumps({"prompt": prompt, "answer": str(answer)}) + "\n")
    return path


def run_once(model: str, overrides: list[str], steps: int) -> dict:
    """One training run in this process: step times, the split and peak RSS."""
    import logging
    import tempfile

    from hydra import compose, initialize_config_dir

    from trainer.config import config_dir
    from trainer.train import train

    logging.disable(logging.WARNING)
    stamps: list[float] = []
    splits: dict[str, list[float]] = {key: [] for key in SPLITS}

    class Timer:
        def report(self, step: int, metrics: dict[str, float]) -> None:
            stamps.append(time.perf_counter())
            if step > 0:
                for key, name in SPLITS.items():
                    splits[key].append(metrics.get(name, 0.0))

    with (
        tempfile.TemporaryDirectory() as out,
        initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"),
    ):
        cfg = compose(
            "config",
            overrides=[
                f"output_dir={out}",
                f"model.path={model}",
                "task=jsonl",
                f"task.path={QUESTIONS}",
                "task.eval_fraction=0.004",  # the evals are not timed: keep them short
                "eval_greedy=false",
                "eval_every=0",
                f"max_steps={steps}",
                "lr=1e-4",
                *SHAPE,
                *overrides,
            ],
        )
        train(cfg, Timer())
    # stamps[0] is the baseline eval; the last step holds the final eval: both excluded
    step_s = [b - a for a, b in zip(stamps, stamps[1:], strict=False)][1:-1] or [
        stamps[-1] - stamps[-2]
    ]
    return {
        "median_step_s": round(statistics.median(step_s), 3),
        "step_s": [round(s, 3) for s in step_s],
        **{f"median_{k}_s": round(statistics.median(v[1:] or v), 3) for k, v in splits.items()},
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def one_run(args: argparse.Namespace, value: str) -> dict:
    command = [sys.executable, __file__, "--only", value, "--key", args.key]
    command += ["--steps", str(args.steps), "--threads", str(args.threads), "--model", args.model]
    command += ["--extra", *args.extra] if args.extra else []
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"failed": done.stderr[-1500:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key", default="learner_batch_tokens", help="the setting compared")
    parser.add_argument("--values", nargs="+", default=["1024", "4096", "16384"])
    parser.add_argument("--extra", nargs="*", default=[], help="overrides for every run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default=None, help="default: tests/real_model.py's")
    parser.add_argument("--only", help=argparse.SUPPRESS)  # internal: one run, JSON to stdout
    args = parser.parse_args()
    if args.model is None:
        sys.path.insert(0, str(Path(__file__).parents[1]))
        from tests.real_model import smollm2_dir

        args.model = str(smollm2_dir())
    if not QUESTIONS.exists():
        write_questions()
    if args.only is not None:
        import torch

        torch.set_num_threads(args.threads)
        overrides = [f"{args.key}={args.only}", *args.extra]
        print(json.dumps(run_once(args.model, overrides, args.steps)))
        return
    runs: dict[str, list[dict]] = {v: [] for v in args.values}
    for r in range(args.rounds):
        for value in args.values:
            runs[value].append(one_run(args, value))
            print(f"[{r + 1}/{args.rounds}] {args.key}={value}: {json.dumps(runs[value][-1])}")
    report = {
        "model": "SmolLM2-135M-Instruct, dequantized Q4_1 (tests/real_model.py)",
        "shape": SHAPE,
        "extra": args.extra,
        "prompts": "plain text, not chat-rendered",
        "threads": args.threads,
        "steps": args.steps,
        "machine": f"{os.cpu_count()} CPUs (shared with other jobs), torch "
        f"{__import__('torch').__version__}",
        "date": time.strftime("%Y-%m-%d"),
        "runs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    name = f"real_model_{args.key}{'_' + '_'.join(args.extra) if args.extra else ''}"
    (RESULTS / f"{name.replace('=', '-')}.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
