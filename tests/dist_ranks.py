"""Rank functions for tests/test_distributed.py, run by trainer.backends.distributed on every
rank (tests/ is on the ranks' PYTHONPATH).

`ddp_rank`: a small linear model wrapped in DistributedDataParallel trains by SGD on a fixed
batch, each rank on its own slice (DDP averages the gradients, so any number of ranks takes
the same steps as one). Every rank calls `reporter.report` after every step (a collective);
rank 0 reports the loss over the whole batch and the gradient. What the test sets in
`cfg.test`: steps, sleep_s (a step's length), raise_at / kill_at ({rank, step}), out (a folder
where each rank writes what it saw: its world size and the last step it reached).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainer.run.train import TrainResult

BATCH, FEATURES = 8, 4


RESUMED_FROM = 2  # the checkpoint step the ranks say they loaded (none is)


def fixed_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, FEATURES, generator=g)
    return x, x @ torch.arange(1.0, FEATURES + 1) + 0.5


def ddp_rank(cfg, reporter) -> TrainResult:
    t = cfg.test
    rank, world = dist.get_rank(), dist.get_world_size()
    seen = {"world_size": world, "threads": torch.get_num_threads(), "last_step": 0}
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(FEATURES, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = fixed_batch()
    Path(t.out).mkdir(parents=True, exist_ok=True)
    mine = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    reporter.resumed(RESUMED_FROM)  # every rank says it; the job hears it once
    for step in range(1, t.steps + 1):
        _note(t.out, rank, seen)
        if t.kill_at and t.kill_at.rank == rank and t.kill_at.step == step:
            os.kill(os.getpid(), signal.SIGKILL)
        if t.raise_at and t.raise_at.rank == rank and t.raise_at.step == step:
            raise ValueError(f"rank {rank} broke at step {step}")
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[mine]).squeeze(-1), y[mine])
        loss.backward()  # DDP all-reduces (averages) the gradient here
        grad = torch.cat([p.grad.flatten() for p in model.parameters()])
        whole = loss.detach().clone()
        dist.all_reduce(whole)  # equal slices: the mean of the means is the batch's mean
        optimizer.step()
        time.sleep(t.sleep_s)
        seen["last_step"] = step
        _note(t.out, rank, seen)
        metrics = {
            "loss": whole.item() / world,
            **{f"grad/{i}": float(g) for i, g in enumerate(grad)},
        }
        reporter.report(step, metrics if rank == 0 else {})
    return TrainResult(
        final_eval=metrics["loss"],
        baseline_eval=None,
        output_dir=Path(t.out),
        final_eval_rewards={},
    )


def _note(out: str, rank: int, seen: dict) -> None:
    # Written whole or not at all: a rank stopped mid-write (the SIGTERM test) left an empty file.
    path = Path(out) / f"rank{rank}.json"
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(seen))
    os.replace(partial, path)


def trl_rank(cfg, reporter) -> TrainResult:
    """TRL's GRPOTrainer on the tiny model for cfg.test.steps steps, as a rank would run it;
    writes accelerate's view of the processes (num_processes, process_index) per rank."""
    import random

    from accelerate import PartialState
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from trainer.env.rewards import exact_match_reward
    from trainer.env.tasks import AdditionTask

    t = cfg.test
    problems = AdditionTask(num_digits=2, eval_size=40, seed=0).train_problems(64, random.Random(0))
    dataset = Dataset.from_list([{"prompt": p.prompt, "answer": p.answer} for p in problems])
    tokenizer = AutoTokenizer.from_pretrained(t.model)

    def reward(completions, answer, **_) -> list[float]:
        return [exact_match_reward(a, c, True) for c, a in zip(completions, answer, strict=True)]

    # Small and quick: 4 completions of 8 tokens a device; no KL term, nothing saved.
    sizes = {"per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 8}
    quiet = {"report_to": "none", "disable_tqdm": True, "save_strategy": "no", "logging_steps": 1}
    args = GRPOConfig(
        output_dir=t.out, max_steps=t.steps, use_cpu=True, seed=0, **sizes, **quiet, beta=0.0
    )
    model = AutoModelForCausalLM.from_pretrained(t.model, dtype=torch.float32)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(
        model, reward, args, dataset, processing_class=tokenizer, peft_config=lora
    )
    trainer.train()
    state = PartialState()
    seen = {
        "num_processes": state.num_processes,
        "process_index": state.process_index,
        "distributed_type": str(state.distributed_type),
        "world_size": dist.get_world_size(),
    }
    (Path(t.out) / f"trl_rank{state.process_index}.json").write_text(json.dumps(seen))
    logged = [h for h in trainer.state.log_history if "loss" in h]
    reporter.report(t.steps, {"trl/loss": logged[-1]["loss"]} if logged else {})
    return TrainResult(final_eval=0.0, baseline_eval=None, output_dir=Path(t.out))
