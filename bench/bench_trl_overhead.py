"""The TRL backend's cost on top of TRL: a trial's step through `backend=trl` against TRL's
GRPOTrainer run by hand on the same GRPOConfig, data and rewards.

    python bench/bench_trl_overhead.py [--rounds 3] [--steps 12] [--note TEXT]

Arms, alternated round by round in one process (A B C A B C):
  by-hand    trl.GRPOTrainer with `mapping.grpo_kwargs`'s GRPOConfig, our rendered prompts as
             its dataset, our rewards as reward_funcs; no callback of ours
  backend    trainer.backends.trl.train_rank with a reporter that logs every step to a real
             MLflow run (SQLite): TRL's trainer plus our reporting callback, the health KLs'
             bookkeeping and the post-update KL's forward (compute_post_kl=true, the default)
  no-post-kl the same with compute_post_kl=false: what the backend costs beside that forward
A step's time is the gap between consecutive optimizer steps' ends (TRL's on_step_end, or our
reporter's report), steps 2.. (the first pays warm-up); no eval runs but the one at step 0 and
at the end, which are left out. Result: bench/results/trl_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from machine_info import machine  # bench/ is on the path: this runs as a script

import trainer  # noqa: F401  (registers the schemas)
from trainer.base.config import config_dir

RESULTS = Path(__file__).parent / "results"
SHAPE = ["backend=trl", "batch_size=8", "group_size=4", "eval_every=0", "task.eval_size=16"]


def config(steps: int, out: str, *extra: str):
    with initialize_config_dir(config_dir(), version_base="1.3"):
        return compose("config", [*SHAPE, f"max_steps={steps}", f"output_dir={out}", *extra])


def by_hand(cfg) -> list[float]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from trainer.backends.trl.data import training_data, with_trl_rewards
    from trainer.backends.trl.mapping import grpo_kwargs
    from trainer.env.prompts import PromptRenderer, prompt_settings
    from trainer.env.tasks import make_task
    from trainer.sampling.model_source import lora_config, model_path

    torch.manual_seed(cfg.seed)
    path = model_path(cfg)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    renderer = PromptRenderer(tokenizer, **prompt_settings(cfg.task))
    task = with_trl_rewards(make_task(cfg.task), cfg.task, renderer)
    data = training_data(cfg, task, renderer, {tokenizer.eos_token_id})
    kwargs = {**grpo_kwargs(cfg, float(cfg.lr)), "reward_weights": data.reward_weights}
    ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **_):
            ends.append(time.perf_counter())

    trainer_ = GRPOTrainer(
        model, data.reward_funcs, GRPOConfig(**kwargs), Dataset.from_list(data.rows),
        processing_class=tokenizer, peft_config=lora_config(cfg), callbacks=[Clock()],
    )  # fmt: skip
    trainer_.train()
    return ends


def through_backend(cfg) -> list[float]:
    from records.tracking import MLflowReporter, MLflowRun
    from records.tracking_store import tracking_client
    from trainer.backends.trl import train_rank

    with tempfile.TemporaryDirectory() as store:
        run = MLflowRun("bench", "trl", client=tracking_client(f"sqlite:///{store}/mlflow.db"))
        reporter, ends = MLflowReporter(run), []

        class Clocked:
            def report(self, step, metrics):
                reporter.report(step, metrics)
                if step:
                    ends.append(time.perf_counter())

        train_rank(cfg, Clocked())
        run.end()
    return ends[:-1]  # the last report carries the final eval


def step_times(ends: list[float]) -> list[float]:
    return [b - a for a, b in zip(ends[1:], ends[2:], strict=False)]  # from step 2 on


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--note", default="")
    a = parser.parse_args()
    arms = {
        "by-hand": lambda out: by_hand(config(a.steps, out)),
        "backend": lambda out: through_backend(config(a.steps, out)),
        "no-post-kl": lambda out: through_backend(config(a.steps, out, "compute_post_kl=false")),
    }
    times: dict[str, list[float]] = {name: [] for name in arms}
    for round_ in range(a.rounds):
        for name, run in arms.items():
            with tempfile.TemporaryDirectory() as out:
                times[name] += step_times(run(out))
            print(round_, name, f"{statistics.median(times[name]) * 1000:.1f} ms", flush=True)
    medians = {name: statistics.median(t) for name, t in times.items()}
    summary = {
        name: {
            "median_ms": 1000 * medians[name],
            "quartiles_ms": [1000 * q for q in statistics.quantiles(t, n=4)[::2]],
            "steps": len(t),
            "vs_by_hand": medians[name] / medians["by-hand"],
        }
        for name, t in times.items()
    }
    RESULTS.mkdir(exist_ok=True)
    out = {"shape": SHAPE, "steps": a.steps, "machine": machine(a.note), "summary": summary}
    (RESULTS / "trl_overhead.json").write_text(
        json.dumps({**out, "step_s": times}, indent=1) + "\n"
    )
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
