"""Checkpoints (trainable weights, optimizer, scheduler, step, RNG, health monitor) and the
final adapter.

Layout under output_dir:
  checkpoints/step_000020/tensors.safetensors  weights, optimizer moments, torch RNG state
  checkpoints/step_000020/state.json           step, scheduler, optimizer settings, Python RNG,
                                               the health monitor's state, the tensors file's
                                               sha256 (written last)
  adapter/                                     the final LoRA adapter in PEFT format
  config.yaml                                  the resolved config the run trained with

Checkpoints live in a shared output directory, so loading one must never run code: no pickle
(safetensors is raw tensors behind a JSON header, state.json is JSON), and everything read is
checked against the live run (names, shapes, keys, types) before any of it is applied. A
checkpoint that fails (corrupt, truncated, tampered with, an old pickle-format state.pt) is
refused with one log line and the next older one is tried, then step 0.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch
from omegaconf import DictConfig, OmegaConf

from trainer.model.policy import Policy
from trainer.run.health import HealthMonitor

log = logging.getLogger(__name__)

FORMAT = 1  # state.json's "format": bumped when the layout changes
TENSORS, STATE = "tensors.safetensors", "state.json"
MAX_STATE_BYTES = 16 * 2**20  # state.json holds settings and 625 RNG words: far below this
STEP_DIR = re.compile(r"step_(\d{6,})")
ADAMW_STATE = {"step", "exp_avg", "exp_avg_sq"}  # per parameter, of the AdamW train() makes


class CheckpointRefused(ValueError):
    """A checkpoint that is not loaded; the message says why."""


@dataclass
class Checkpoint:
    path: Path  # the step directory
    step: int
    state: dict  # state.json
    tensors: dict[str, torch.Tensor]


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"step_{step:06d}"


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    policy: Policy,
    optimizer,
    scheduler,
    rng: random.Random,
    health: dict | None = None,
) -> Path:
    """health: the run's HealthMonitor.state() after this step, so a resumed run's rules
    decide exactly as an uninterrupted run's."""
    target = checkpoint_dir(output_dir, step)
    target.mkdir(parents=True, exist_ok=True)
    tensors = {
        f"trainable/{n}": p.detach().cpu().contiguous()
        for n, p in policy.model.named_parameters()
        if p.requires_grad
    }
    optimizer_state = optimizer.state_dict()
    for index, entry in optimizer_state["state"].items():
        for key, value in entry.items():
            tensors[f"optimizer/{index}/{key}"] = value.detach().cpu().contiguous()
    tensors["rng/torch"] = torch.get_rng_state()
    if torch.cuda.is_available():
        for i, cuda_state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng/cuda/{i}"] = cuda_state
    data = safetensors.torch.save(tensors)
    version, words, gauss = rng.getstate()
    state = {
        "format": FORMAT,
        "step": step,
        "tensors_sha256": hashlib.sha256(data).hexdigest(),
        "optimizer_groups": optimizer_state["param_groups"],
        "scheduler": scheduler.state_dict(),
        "python_rng": [version, list(words), gauss],
        **({} if health is None else {"health": health}),
    }
    # state.json last, each file renamed into place whole: a save cut short leaves a folder
    # whose state.json is missing or names another tensors file's hash, refused on load.
    _write(target / TENSORS, data)
    _write(target / STATE, json.dumps(state).encode())
    return target


def _write(path: Path, data: bytes) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    partial.rename(path)


def checkpoint_dirs(output_dir: str | Path) -> list[Path]:
    """Every step folder under output_dir/checkpoints, newest first."""
    folders = (Path(output_dir) / "checkpoints").glob("step_*")
    steps = {int(m[1]): p for p in folders if (m := STEP_DIR.fullmatch(p.name)) and p.is_dir()}
    return [steps[s] for s in sorted(steps, reverse=True)]


def read_checkpoint(path: Path) -> Checkpoint:
    """Read and check one step folder without applying it; raises CheckpointRefused."""
    try:
        return _read(path)
    except CheckpointRefused:
        raise
    except Exception as e:  # whatever a hostile or broken file makes a parser raise
        raise CheckpointRefused(f"unreadable ({type(e).__name__}: {e})") from e


def _read(path: Path) -> Checkpoint:
    state_file = path / STATE
    if not state_file.exists():
        if (path / "state.pt").exists():
            raise CheckpointRefused(
                "an old pickle-format state.pt, never unpickled (loading it could run code)"
            )
        raise CheckpointRefused(f"no {STATE} (a save cut short)")
    if state_file.stat().st_size > MAX_STATE_BYTES:
        raise CheckpointRefused(f"{STATE} is larger than {MAX_STATE_BYTES} bytes")
    state = json.loads(state_file.read_bytes())
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointRefused(f"{STATE} is not format {FORMAT}")
    step = state.get("step")
    if type(step) is not int or f"step_{step:06d}" != path.name:
        raise CheckpointRefused(f"{STATE} says step {step!r}, the folder is {path.name}")
    data = (path / TENSORS).read_bytes()
    if hashlib.sha256(data).hexdigest() != state.get("tensors_sha256"):
        raise CheckpointRefused(f"{TENSORS} does not match the sha256 in {STATE}")
    tensors = safetensors.torch.load(data)
    random.Random().setstate(_python_rng(state.get("python_rng")))  # a scratch one checks it
    torch.Generator().set_state(tensors.get("rng/torch", torch.empty(0, dtype=torch.uint8)))
    return Checkpoint(path, step, state, tensors)


def _python_rng(saved) -> tuple:
    if not (isinstance(saved, list) and len(saved) == 3 and isinstance(saved[1], list)):
        raise CheckpointRefused("python_rng is not [version, words, gauss]")
    return saved[0], tuple(saved[1]), saved[2]


def newest_readable(output_dir: str | Path, warn: bool = True) -> Checkpoint | None:
    """The newest checkpoint that reads and checks, logging each newer one refused."""
    for path in checkpoint_dirs(output_dir):
        try:
            return read_checkpoint(path)
        except CheckpointRefused as e:
            if warn:
                log.warning("Checkpoint %s refused: %s; trying the one before", path, e)
    return None


def resumable_step(output_dir: str | Path) -> int | None:
    """The step `resume=true` continues from (None: from step 0)."""
    checkpoint = newest_readable(output_dir, warn=False)
    return None if checkpoint is None else checkpoint.step


def resume(
    output_dir: str | Path,
    policy: Policy,
    optimizer,
    scheduler,
    rng,
    monitor: HealthMonitor | None = None,
) -> int | None:
    """Restore the newest checkpoint that reads and fits this run (and the health monitor's
    state into `monitor`); returns its step, or None when none does (the run starts at
    step 0)."""
    for path in checkpoint_dirs(output_dir):
        try:
            checkpoint = read_checkpoint(path)
            restored = _fit(checkpoint, policy, optimizer, scheduler)
            health = _health(checkpoint, monitor)
        except CheckpointRefused as e:
            log.warning("Checkpoint %s refused: %s; trying the one before", path, e)
            continue
        if monitor is not None and health is not None:
            monitor.load_state(health)
        weights, optimizer_state, scheduler_state = restored
        policy.model.load_state_dict(weights, strict=False)
        optimizer.load_state_dict(optimizer_state)
        scheduler.load_state_dict(scheduler_state)
        rng.setstate(_python_rng(checkpoint.state["python_rng"]))
        torch.set_rng_state(checkpoint.tensors["rng/torch"])
        cuda = [checkpoint.tensors.get(f"rng/cuda/{i}") for i in range(torch.cuda.device_count())]
        if cuda and all(s is not None for s in cuda):
            torch.cuda.set_rng_state_all(cuda)
        return checkpoint.step
    return None


def _health(checkpoint: Checkpoint, monitor: HealthMonitor | None) -> dict | None:
    """The saved monitor state, checked on a scratch monitor; one saved without it (an older
    checkpoint) starts the monitor afresh, which a line says."""
    saved = checkpoint.state.get("health")
    if saved is None:
        if monitor is not None:
            log.warning(
                "Checkpoint %s holds no health monitor state: its rules start afresh",
                checkpoint.path,
            )
        return None
    try:
        HealthMonitor(monitor.rules if monitor is not None else []).load_state(saved)
    except ValueError as e:
        raise CheckpointRefused(str(e)) from None
    return saved


def _fit(checkpoint: Checkpoint, policy: Policy, optimizer, scheduler) -> tuple:
    """The checkpoint as state dicts for this run's model, optimizer and scheduler, each
    checked against the live one: same names, shapes, keys and value types."""
    params = {n: p for n, p in policy.model.named_parameters() if p.requires_grad}
    groups = {k.split("/", 1)[0] for k in checkpoint.tensors}
    if groups - {"trainable", "optimizer", "rng"}:
        raise CheckpointRefused(f"unknown tensors {sorted(groups)}")
    weights = {
        k.removeprefix("trainable/"): t
        for k, t in checkpoint.tensors.items()
        if k.startswith("trainable/")
    }
    if weights.keys() != params.keys():
        differ = sorted(weights.keys() ^ params.keys())
        raise CheckpointRefused(f"its weights are not this model's trainable ones: {differ[:3]}")
    for name, tensor in weights.items():
        _same_shape(name, tensor, params[name])
    live = optimizer.state_dict()
    ordered = list(params.values())  # the optimizer's parameter order
    optimizer_state: dict[int, dict[str, torch.Tensor]] = {}
    for key, tensor in checkpoint.tensors.items():
        if key.startswith("optimizer/"):
            _, index, name = key.split("/", 2)
            if not index.isdigit() or int(index) >= len(ordered):
                raise CheckpointRefused(f"optimizer state for parameter {index!r}")
            if tensor.ndim:
                _same_shape(key, tensor, ordered[int(index)])
            optimizer_state.setdefault(int(index), {})[name] = tensor
    if any(entry.keys() != ADAMW_STATE for entry in optimizer_state.values()):
        raise CheckpointRefused(f"optimizer state is not AdamW's {sorted(ADAMW_STATE)}")
    groups_saved = _conform(checkpoint.state.get("optimizer_groups"), live["param_groups"], "opt")
    sched = _conform(checkpoint.state.get("scheduler"), scheduler.state_dict(), "scheduler")
    return weights, {"state": optimizer_state, "param_groups": groups_saved}, sched


def _same_shape(name: str, saved: torch.Tensor, live: torch.Tensor) -> None:
    if saved.shape != live.shape or not saved.dtype.is_floating_point:
        raise CheckpointRefused(f"{name} is {saved.dtype} {list(saved.shape)}, not {live.shape}")


def _conform(saved, live, where: str):
    """saved (from JSON) with the live value's structure: the same dict keys, list lengths and
    value types (a JSON list becomes the tuple the live one is); refused otherwise."""
    if isinstance(live, dict):
        if not isinstance(saved, dict) or saved.keys() != live.keys():
            raise CheckpointRefused(f"{where} has keys {_keys(saved)}, this run {_keys(live)}")
        return {k: _conform(saved[k], live[k], f"{where}.{k}") for k in live}
    if isinstance(live, list | tuple):
        if not isinstance(saved, list) or len(saved) != len(live):
            raise CheckpointRefused(f"{where} is not a list of {len(live)}")
        return type(live)(
            _conform(s, v, f"{where}[{i}]")
            for i, (s, v) in enumerate(zip(saved, live, strict=True))
        )
    if type(saved) is not type(live):
        raise CheckpointRefused(f"{where} is {type(saved).__name__}, not {type(live).__name__}")
    return saved


def _keys(value) -> list:
    return sorted(value)[:5] if isinstance(value, dict) else type(value).__name__


def save_final(output_dir: str | Path, policy: Policy, cfg: DictConfig) -> Path:
    target = Path(output_dir) / "adapter"
    policy.model.save_pretrained(target)  # PEFT writes only the adapter
    policy.tokenizer.save_pretrained(target)
    (Path(output_dir) / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    return target
