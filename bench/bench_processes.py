"""One TRL trial on 1 process against 2 processes on CPU, alternated A B A B.

    python bench/bench_processes.py --steps 6 --repeats 2

Each run is `trainer.backends.distributed.launch` (torch.distributed.run, gloo) of TRL's
GRPOTrainer on the tiny model with equal work a step: 8 prompts x 4 completions of 8 tokens
(one process takes all 32, each of two takes 16), LoRA r8, no KL term, and equal threads in
all (2 threads in one process, 1 thread in each of 2). Per run: the median step time
excluding the first step, the launch's wall time (process start and model load included) and
TRL's last logged reward and loss. Nothing here asserts a timing; the result goes to
bench/results/processes.json with the CPU model and package versions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from importlib.metadata import version
from pathlib import Path

from bench_models import model_dir  # bench/ is on the path: this runs as a script

RESULTS = Path(__file__).parent / "results"
PROMPTS, GROUP, TOKENS = 8, 4, 8


def trl_rank(cfg, reporter):
    """A rank: GRPOTrainer on the tiny addition task; rank 0 reports its step times."""
    import random

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from trainer.env.rewards import exact_match_reward
    from trainer.env.tasks import AdditionTask

    b = cfg.bench
    torch.set_num_threads(b.threads)
    problems = AdditionTask(num_digits=2, eval_size=40, seed=0).train_problems(
        PROMPTS * (b.steps + 1), random.Random(0)
    )
    dataset = Dataset.from_list([{"prompt": p.prompt, "answer": p.answer} for p in problems])

    def reward(completions, answer, **_) -> list[float]:
        return [exact_match_reward(a, c, True) for c, a in zip(completions, answer, strict=True)]

    args = GRPOConfig(
        output_dir=b.out,
        per_device_train_batch_size=PROMPTS * GROUP // cfg.backend.processes,
        num_generations=GROUP,
        max_completion_length=TOKENS,
        learning_rate=2e-3,
        lr_scheduler_type="constant",
        beta=0.0,
        max_steps=b.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        shuffle_dataset=False,
        gradient_checkpointing=False,
    )
    step_s: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.started = time.perf_counter()

        def on_step_end(self, *_, **__):
            step_s.append(time.perf_counter() - self.started)

    model = AutoModelForCausalLM.from_pretrained(b.model, dtype=torch.float32)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    tokenizer = AutoTokenizer.from_pretrained(b.model)
    trainer = GRPOTrainer(
        model, reward, args, dataset, processing_class=tokenizer, peft_config=lora
    )
    trainer.add_callback(Timer())
    trainer.train()
    last = [h for h in trainer.state.log_history if "loss" in h][-1]
    metrics = {"reward": last["reward"], "loss": last["loss"]}
    metrics |= {f"step_s/{i}": s for i, s in enumerate(step_s)}
    reporter.report(b.steps, metrics)
    return None


class Keep:
    def report(self, step, metrics):
        self.metrics = metrics


def one_run(processes: int, steps: int, out: Path) -> dict:
    from omegaconf import OmegaConf

    from trainer.backends.distributed import launch

    threads = 2 // processes
    cfg = OmegaConf.create(
        {
            "backend": {"processes": processes},
            "model": {"device": "cpu"},
            "bench": {
                "steps": steps,
                "threads": threads,
                "out": str(out),
                "model": str(model_dir("tiny")),
            },
        }
    )
    keep, started = Keep(), time.perf_counter()
    launch(cfg, keep, "bench_processes:trl_rank")
    wall = time.perf_counter() - started
    steps_s = [v for k, v in sorted(keep.metrics.items()) if k.startswith("step_s/")]
    return {
        "processes": processes,
        "threads_each": threads,
        "median_step_s": round(statistics.median(steps_s[1:]), 4),
        "wall_s": round(wall, 2),
        "reward": keep.metrics["reward"],
        "loss": keep.metrics["loss"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2, help="A B pairs")
    args = parser.parse_args()
    here = str(Path(__file__).parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    runs: dict[str, list[dict]] = {"1": [], "2": []}
    for repeat in range(args.repeats):
        for processes in (1, 2):
            result = one_run(processes, args.steps, Path("/tmp/bench_processes"))
            runs[str(processes)].append(result)
            print(f"[{repeat + 1}/{args.repeats}] {json.dumps(result)}", flush=True)
    ratios = [
        b["median_step_s"] / a["median_step_s"] for a, b in zip(runs["1"], runs["2"], strict=True)
    ]
    report = {
        "workload": {"prompts": PROMPTS, "group": GROUP, "tokens": TOKENS, "steps": args.steps},
        "machine": f"{platform.processor() or platform.machine()}, {_cpu_model()}, "
        f"{os.cpu_count()} CPUs (shared with other jobs while measured)",
        "versions": {p: version(p) for p in ("torch", "trl", "transformers", "accelerate", "peft")},
        "date": time.strftime("%Y-%m-%d"),
        "runs": runs,
        "step_time_ratio_2_over_1": {
            "median": round(statistics.median(ratios), 2),
            "min": round(min(ratios), 2),
            "max": round(max(ratios), 2),
        },
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "processes.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["step_time_ratio_2_over_1"]))


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
