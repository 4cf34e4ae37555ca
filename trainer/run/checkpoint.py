"""Checkpoints (trainable weights, optimizer, scheduler, step, RNG) and the final adapter.

Layout under output_dir:
  checkpoints/step_000020/state.pt   everything `resume=true` needs to continue exactly
  adapter/                           the final LoRA adapter in PEFT format (or full model)
  config.yaml                        the resolved config the run trained with
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from trainer.model.policy import Policy


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"step_{step:06d}"


def save_checkpoint(
    output_dir: str | Path, step: int, policy: Policy, optimizer, scheduler, rng: random.Random
) -> Path:
    target = checkpoint_dir(output_dir, step)
    target.mkdir(parents=True, exist_ok=True)
    trainable = {n: p.detach().cpu() for n, p in policy.model.named_parameters() if p.requires_grad}
    state = {
        "step": step,
        "trainable": trainable,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "python_rng": rng.getstate(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }
    partial = target / "state.pt.partial"
    torch.save(state, partial)
    partial.rename(target / "state.pt")  # a crash mid-write never leaves a corrupt checkpoint
    return target


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    states = sorted((Path(output_dir) / "checkpoints").glob("step_*/state.pt"))
    return states[-1] if states else None


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint (`.../step_000020/state.pt`) was taken after."""
    return int(path.parent.name.removeprefix("step_"))


def load_checkpoint(path: Path, policy: Policy, optimizer, scheduler, rng: random.Random) -> int:
    """Restore everything saved by save_checkpoint; returns the step it was taken after."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    missing = policy.model.load_state_dict(state["trainable"], strict=False).unexpected_keys
    if missing:
        raise RuntimeError(f"checkpoint {path} has weights this model lacks: {missing[:3]}")
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    rng.setstate(state["python_rng"])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return int(state["step"])


def save_final(output_dir: str | Path, policy: Policy, cfg: DictConfig) -> Path:
    target = Path(output_dir) / "adapter"
    policy.model.save_pretrained(target)  # PEFT writes only the adapter
    policy.tokenizer.save_pretrained(target)
    (Path(output_dir) / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    return target
