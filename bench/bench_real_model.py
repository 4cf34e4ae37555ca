"""Peak memory and step time of our trainer on the real model, SmolLM2-135M-Instruct.

    python tests/real_model.py                       # builds the model directory once
    python bench/bench_real_model.py --values 1024 4096 16384 --rounds 2
    python bench/bench_real_model.py --key gradient_checkpointing --values false true

Each run is its own process (so its peak RSS is its own): `batch_size=32 group_size=8
max_tokens=64` (the default batch shape), LoRA r8 on every linear layer, fp32, on the
arithmetic questions in bench/arithmetic.jsonl (`task=jsonl`, prompts chat-rendered when the
file was written, `write_questions`), torch on --threads threads, --steps steps, through bench_vs_trl.py's run_ours.
Runs alternate over the values of --key, --rounds times. Per run: the median step time, the
split (sampling, the learner's forward+backward, the optimizer, the post-update KL, the
reference with --extra kl_penalty_coef=...) and peak RSS. Nothing asserts a timing; results go
to bench/results/real_model_<key>.json and BENCHMARKS.md. The model is a dequantized Q4_1 copy,
not the released bf16 weights (tests/real_model.py).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

from bench_vs_trl import QUESTIONS, RESULTS, run_ours  # bench/ is on the path: a script
from machine_info import machine  # bench/ is on the path: this runs as a script

SHAPE = {"prompts": 32, "group": 8, "tokens": 64, "rank": 8, "model": "smollm2"}


def write_questions(model: str, path: Path = QUESTIONS, rows: int = 500, seed: int = 0) -> Path:
    """Arithmetic questions that ask for the working, {"prompt", "answer"} rows, each prompt
    rendered once here with the model's chat template (the task's own rendering is another
    issue's): plain text makes SmolLM2 end at once, and asked for the number only it ends
    within a few tokens; asked to think step by step it fills 32 and mostly 64 tokens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(rows):
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            op = rng.choice("+-*")
            answer = a + b if op == "+" else a - b if op == "-" else a * b
            message = {"role": "user", "content": f"What is {a} {op} {b}? Think step by step."}
            prompt = tokenizer.apply_chat_template(
                [message], tokenize=False, add_generation_prompt=True
            )
            f.write(json.dumps({"prompt": prompt, "answer": str(answer)}) + "\n")
    return path


def one_run(args: argparse.Namespace, value: str) -> dict:
    """A run in a fresh process, so its peak memory is its own."""
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
    parser.add_argument("--steps", type=int, default=3, help="per run; the first is not timed")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default=None, help="default: tests/real_model.py's")
    parser.add_argument("--only", help=argparse.SUPPRESS)  # internal: one run, JSON to stdout
    args = parser.parse_args()
    if args.model is None:
        sys.path.insert(0, str(Path(__file__).parents[1]))
        from tests.real_model import smollm2_dir

        args.model = str(smollm2_dir())
    if not QUESTIONS.exists():
        write_questions(args.model)
    if args.only is not None:
        import torch

        torch.set_num_threads(args.threads)
        extra = (f"{args.key}={args.only}", *args.extra)
        print(json.dumps(run_ours(SHAPE, Path(args.model), args.steps, extra)))
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
        "prompts": "chat-rendered in bench/arithmetic.jsonl (write_questions)",
        "threads": args.threads,
        "steps": args.steps,
        "machine": machine("shared with other jobs"),
        "date": time.strftime("%Y-%m-%d"),
        "runs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    name = "_".join([f"real_model_{args.key}", *args.extra]).replace("=", "-")
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
