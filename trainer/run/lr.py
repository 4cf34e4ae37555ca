"""Learning rate: a recommended value from the model's size, and the schedule over steps."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from omegaconf import DictConfig

if TYPE_CHECKING:
    import torch

# Exponent p of the hidden-size scaling, per model family (calibrated for Llama and Qwen).
LR_EXPONENTS = {"llama": 0.781, "qwen": 0.0775}
BASE_LR = 5e-5  # full fine-tuning at hidden size 2000
LORA_MULTIPLIER = 10.0  # LoRA wants ~10x the full fine-tuning rate, at any rank
# lr_schedule -> the transformers schedule that implements it (warmup first, in each).
LR_SCHEDULES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


def get_lr(hidden_size: int, family: str, lora: bool = True) -> float:
    """lr = 5e-5 x (10 for LoRA) x (2000 / hidden_size) ** p(family)."""
    if family not in LR_EXPONENTS:
        raise ValueError(f"model.family={family!r}: lr=auto knows {sorted(LR_EXPONENTS)}")
    base = BASE_LR * (LORA_MULTIPLIER if lora else 1.0)
    return base * (2000 / hidden_size) ** LR_EXPONENTS[family]


def resolve_lr(cfg: DictConfig, hidden_size: int) -> float:
    """The lr to train with: explicit or auto, then the optional sqrt(batch_size) scaling."""
    lr = get_lr(hidden_size, cfg.model.family, cfg.lora_rank > 0) if cfg.lr == "auto" else cfg.lr
    if cfg.lr_batch_scaling:  # LR proportional to sqrt(batch_size), as the seeds recommend
        lr *= math.sqrt(cfg.batch_size / cfg.lr_reference_batch_size)
    return float(lr)


def make_scheduler(cfg: DictConfig, optimizer: torch.optim.Optimizer):
    """Linear warmup over warmup_steps, then constant, linear or cosine decay to max_steps."""
    # Imported here: transformers.optimization pulls in transformers' Trainer utilities and
    # PEFT (seconds), which the config checks that import this module never need.
    from transformers import get_scheduler

    return get_scheduler(
        LR_SCHEDULES[cfg.lr_schedule],
        optimizer,
        num_warmup_steps=cfg.warmup_steps,
        num_training_steps=cfg.max_steps,
    )
