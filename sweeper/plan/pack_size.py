"""`hydra.sweeper.pack=auto`: how many jobs a sweep packs (trainer/packed/), from what was
measured on a CPU and from the free memory of a GPU.

The rules are pure functions of numbers (cpu_pack, gpu_pack, member_bytes); auto_pack reads
those numbers off the sweep (its largest batch, its model, the device) and says why it chose.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from sweeper.plan.space import SearchSpace

log = logging.getLogger(__name__)

AUTO = "auto"
MAX_PACK = 8  # the largest pack measured (bench/PACKED.md)
# bench/PACKED.md: a CPU step costs the same per rollout from 64 to 256 rollouts, more above.
CPU_ROLLOUTS = 256
# bench/PACKED.md: 16 rollouts a trial packed 1.16-1.21x faster; 256 (the default) 0.71x
# slower. One trial of 64 already fills the CPU's batch, so packing it shares nothing.
CPU_FILLED = 64
FLOAT32 = 4  # bytes


@dataclass(frozen=True)
class ModelShape:
    """What a member's memory is estimated from: the model's config.json."""

    params: int
    layers: int
    hidden: int
    vocab: int


def cpu_pack(rollouts: int, jobs: int) -> tuple[int, str]:
    """K on a CPU for trials of `rollouts` a step, `jobs` jobs in the sweep; and why."""
    where = f"CPU, {rollouts} rollouts a step"
    if rollouts >= CPU_FILLED:
        return 1, f"{where}: from {CPU_FILLED} a trial fills the CPU alone (packed 256: 0.71x)"
    k = max(1, min(MAX_PACK, CPU_ROLLOUTS // rollouts, jobs))
    return k, f"{where}: packed up to {CPU_ROLLOUTS} rollouts, at most {MAX_PACK} and {jobs} jobs"


def member_bytes(shape: ModelShape, batch_tokens: int) -> int:
    """One member's extra memory on a GPU, high on purpose:
    - 4 bytes a base parameter (a float32 copy of the model) for its adapter, gradients, AdamW
      moments and own tensors; SmolLM2 measured 1.4 (180 MiB a member, bench/PACKED.md);
    - its decode's KV cache, `sampler.batch_tokens` tokens at float32 with every head (more
      than grouped-query attention keeps), and the logits of a log-prob pass that long.
    The learner's activations are not counted: a pack runs its members' learner pieces within
    one solo piece's budget (trainer/packed/batches.py), so they are a solo run's."""
    per_token = 2 * shape.layers * shape.hidden + shape.vocab
    return FLOAT32 * (shape.params + batch_tokens * per_token)


def gpu_pack(free: int, base: int, member: int, jobs: int) -> tuple[int, str]:
    """K on a GPU with `free` bytes free, of which the pack's base model takes `base`, and
    `member` bytes a member (member_bytes); and why."""
    k = max(1, min(MAX_PACK, (free - base) // member, jobs))
    gib = 2**30
    return k, (
        f"GPU, {free / gib:.1f} GiB free, less {base / gib:.1f} GiB for the base model, "
        f"over {member / gib:.1f} GiB a member; at most {MAX_PACK} and {jobs} jobs"
    )


def model_shape(config: dict) -> ModelShape:
    """The shape of a Llama-like model from its config.json; its parameters counted high
    (every attention projection full width, as without grouped-query attention)."""
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    vocab, inner = config["vocab_size"], config.get("intermediate_size", 4 * hidden)
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", True) else 2)
    params = embeddings + layers * (4 * hidden**2 + 3 * hidden * inner)
    return ModelShape(params, layers, hidden, vocab)


def largest(space: SearchSpace, config: DictConfig, key: str) -> int:
    """`key`'s largest value in the sweep: the largest swept value, else the config's."""
    param = space.params.get(key)
    if param is None:
        return int(config[key])
    return max(int(v) for v in param.endpoints)


def auto_pack(config: DictConfig, space: SearchSpace, jobs: int) -> int:
    """K for pack=auto; one line of the log says which and why."""
    import torch  # only for pack=auto

    rollouts = largest(space, config, "batch_size") * largest(space, config, "group_size")
    device = str(config.model.device)
    gpu = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if gpu:
        k, why = gpu_pack(*_gpu_numbers(config, device), jobs)
    else:
        k, why = cpu_pack(rollouts, jobs)
    log.info("pack=auto: %d (%s)", k, why)
    return k


def _gpu_numbers(config: DictConfig, device: str) -> tuple[int, int, int]:
    """Free bytes, the base model's (float32 at most), a member's."""
    import torch

    from trainer.sampling.model_source import model_path

    free, _ = torch.cuda.mem_get_info(None if device == "auto" else torch.device(device))
    shape = model_shape(json.loads((Path(model_path(config)) / "config.json").read_text()))
    return free, FLOAT32 * shape.params, member_bytes(shape, int(config.sampler.batch_tokens))
