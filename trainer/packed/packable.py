"""Which trials can pack: those that can share one base model and one batch shape."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from trainer.base.errors import ConfigError
from trainer.sampling.model_source import resolve_device

# Keys that must be equal for trials to share one base model and one batch shape.
SHARED_KEYS = (
    "model.path",
    "model.dtype",
    "model.device",
    "model.tiny",
    "lora_rank",
    "lora_target_modules",
    "lora_dropout",
    "gradient_checkpointing",
    "sampler.name",
    "pipeline",
)


def check_packable(cfgs: list[DictConfig]) -> None:
    """ConfigError unless the trials can share one base model: the same model, LoRA rank and
    targets, our backend in one process, the torch sampler on a CPU, no LoRA dropout, and not
    the async pipeline (which samples on a copy of its own)."""
    first = cfgs[0]
    for cfg in cfgs[1:]:
        for key in SHARED_KEYS:
            if OmegaConf.select(cfg, key) != OmegaConf.select(first, key):
                shared = OmegaConf.select(first, key)
                raise ConfigError(f"{key}: packed trials must share it ({shared!r})")
    if first.lora_rank == 0 or first.lora_dropout != 0:
        raise ConfigError("packed trials train LoRA adapters without dropout (lora_rank > 0)")
    if first.backend.name != "ours" or first.backend.processes != 1:
        raise ConfigError("packed trials train with backend=ours, in one process")
    if first.sampler.name != "torch" or first.pipeline == "async":
        raise ConfigError("packed trials sample with sampler=torch, pipeline sync or stream")
    if resolve_device(first.model.device).type != "cpu":
        raise ConfigError("packed trials run on a CPU for now (their generators are CPU ones)")
