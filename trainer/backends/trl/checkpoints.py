"""TRL's checkpoints in a run's output_dir, in our steps: what `resume=true` continues from.

TRL saves `output_dir/checkpoint-<global_step>/` (optimizer steps: num_substeps a step of
ours), its trainer_state.json written once the folder holds everything. No TRL import, so the
sweep job reads it cheaply (transformers and PEFT only inside `check`).

Checkpoints live in a shared output directory, so a resume must never run code nor stop the
worker. transformers' Trainer (5.x) reads a checkpoint as JSON (trainer_state.json,
adapter_config.json), safetensors (the weights) and torch.load(weights_only=True) (optimizer,
scheduler, scaler, RNG states; training_args.bin is never read back): no pickle that can run
code. `check` reads every one of those files as Trainer will, and checks what it read against
the live run (the model's trainable weights and their optimizer state, the scheduler's keys,
RNG states that set), so a checkpoint that is corrupt, truncated, tampered with or not this
run's is refused with one log line and the one before is tried, then step 0, as ours
(trainer/run/checkpoint.py).
"""

from __future__ import annotations

import json
import logging
import random
import re
from pathlib import Path

from trainer.run.checkpoint import MAX_STATE_BYTES, CheckpointRefused

log = logging.getLogger(__name__)

PREFIX = "checkpoint-"  # transformers' PREFIX_CHECKPOINT_DIR
COMPLETE = "trainer_state.json"
WEIGHTS = ("adapter_model.safetensors", "model.safetensors")  # the files Trainer reads first
OPTIMIZER, SCHEDULER, SCALER = "optimizer.pt", "scheduler.pt", "scaler.pt"
HEALTH = "health.json"  # ours (callback.py): the health monitor's state after that step
RNG_FILE = re.compile(r"rng_state(_\d+)?\.pth")
# adapter_config.json keys that differ between a saved adapter and the live one it came from
ADAPTER_VOLATILE = {"base_model_name_or_path", "revision", "peft_version", "inference_mode"}


def checkpoint_dirs(output_dir: str | Path) -> list[Path]:
    """Every checkpoint-<global_step> folder, newest first."""
    found = [
        path
        for path in Path(output_dir).glob(f"{PREFIX}*")
        if path.name.removeprefix(PREFIX).isdigit() and path.is_dir()
    ]
    return sorted(found, key=global_step, reverse=True)


def global_step(path: Path) -> int:
    return int(path.name.removeprefix(PREFIX))


def newest_usable(output_dir: str | Path, trainer=None, warn: bool = True) -> Path | None:
    """The newest checkpoint that `check` passes (with the live trainer, that fits it),
    logging each newer one refused; None: the run starts at step 0."""
    for path in checkpoint_dirs(output_dir):
        try:
            check(path, trainer)
            return path
        except CheckpointRefused as e:
            if warn:
                log.warning("Checkpoint %s refused: %s; trying the one before", path, e)
    return None


def resumed_from_step(cfg) -> int | None:
    """The step of ours a `resume=true` run continues from (None: a fresh start), as far as
    can be told before the model is built."""
    checkpoint = newest_usable(cfg.output_dir, warn=False) if cfg.resume else None
    return None if checkpoint is None else step_of(checkpoint, cfg)


def step_of(checkpoint: Path, cfg) -> int:
    return global_step(checkpoint) // cfg.num_substeps


def check(path: Path, trainer=None) -> None:
    """Read every file of `path` that Trainer's resume reads, as it reads it; raises
    CheckpointRefused saying why not. With `trainer` (before its train()), what was read is
    checked against its model too."""
    try:
        _check(path, trainer)
    except CheckpointRefused:
        raise
    except Exception as e:  # whatever a hostile or broken file makes a reader raise
        first = next(iter(str(e).splitlines()), "")  # torch's own run to a dozen lines
        raise CheckpointRefused(f"unreadable ({type(e).__name__}: {first})") from e


def _check(path: Path, trainer) -> None:
    import safetensors.torch

    if not (path / COMPLETE).is_file():
        raise CheckpointRefused(f"no {COMPLETE} (a save cut short)")
    _trainer_state(_json(path / COMPLETE), path)
    if folders := sorted(p.name for p in path.iterdir() if p.is_dir()):
        # Trainer would load a sub-folder as another adapter (or FSDP state); TRL writes none
        raise CheckpointRefused(f"holds folders {folders[:3]}, which a TRL run never writes")
    weights = next((path / name for name in WEIGHTS if (path / name).is_file()), None)
    if weights is None:
        raise CheckpointRefused(f"no {' or '.join(WEIGHTS)}")
    tensors = safetensors.torch.load_file(weights)
    for name in (OPTIMIZER, SCHEDULER):
        if not (path / name).is_file():
            raise CheckpointRefused(f"no {name}")
    optimizer, scheduler = _torch_load(path / OPTIMIZER), _torch_load(path / SCHEDULER)
    _scheduler(scheduler)
    if (path / SCALER).is_file() and not isinstance(_torch_load(path / SCALER), dict):
        raise CheckpointRefused(f"{SCALER} is not a state dict")
    for rng in path.iterdir():
        if RNG_FILE.fullmatch(rng.name):
            _rng(_torch_load(rng), rng.name)
    if (path / HEALTH).is_file():
        from trainer.run.health import HealthMonitor

        try:
            HealthMonitor([]).load_state(_json(path / HEALTH))
        except ValueError as e:
            raise CheckpointRefused(f"{HEALTH}: {e}") from None
    if trainer is not None:
        _fits(path, weights, tensors, optimizer, trainer)


def _json(file: Path):
    if file.stat().st_size > MAX_STATE_BYTES:
        raise CheckpointRefused(f"{file.name} is larger than {MAX_STATE_BYTES} bytes")
    return json.loads(file.read_bytes())


def _trainer_state(state, path: Path) -> None:
    from dataclasses import fields

    from transformers import TrainerState

    if not isinstance(state, dict) or state.get("global_step") != global_step(path):
        step = state.get("global_step") if isinstance(state, dict) else None
        raise CheckpointRefused(f"{COMPLETE} says global step {step!r}, the folder is {path.name}")
    if unknown := sorted(state.keys() - {f.name for f in fields(TrainerState)}):
        raise CheckpointRefused(f"{COMPLETE} has keys TrainerState has not: {unknown[:3]}")


def _torch_load(file: Path):
    """As Trainer loads it: weights_only=True (no code), transformers' numpy allowlist."""
    import warnings

    import torch
    from transformers.trainer_pt_utils import safe_globals

    with safe_globals(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a planted pickle's protocol: refused all the same
        try:
            return torch.load(file, map_location="cpu", weights_only=True)
        except Exception as e:
            why = f"{type(e).__name__}, a pickle that may run code or a broken file"
            refused = f"{file.name} does not load with weights_only=True ({why})"
            raise CheckpointRefused(refused) from e


def _scheduler(saved) -> None:
    """Trainer's LambdaLR schedules take a state dict into their __dict__: only its own keys,
    and no lambda state (their partials hold none)."""
    import torch

    scratch = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    keys = torch.optim.lr_scheduler.LambdaLR(scratch, lambda _: 1.0).state_dict().keys()
    if not isinstance(saved, dict) or saved.keys() != keys:
        raise CheckpointRefused(f"{SCHEDULER} is not a LambdaLR state dict")
    if any(entry not in ({}, None) for entry in saved["lr_lambdas"]):
        raise CheckpointRefused(f"{SCHEDULER} sets attributes of its lr functions")


def _rng(saved, name: str) -> None:
    """Each state Trainer restores, set on a scratch generator first."""
    import numpy as np
    import torch

    if not isinstance(saved, dict):
        raise CheckpointRefused(f"{name} is not a dict")
    random.Random().setstate(saved["python"])
    np.random.RandomState().set_state(saved["numpy"])
    torch.Generator().set_state(saved["cpu"])
    cuda = saved.get("cuda")
    states = cuda if isinstance(cuda, list | tuple) else [] if cuda is None else [cuda]
    if not all(isinstance(s, torch.Tensor) and s.dtype == torch.uint8 for s in states):
        raise CheckpointRefused(f"{name}'s cuda state is not byte tensors")


def _fits(path: Path, weights: Path, tensors: dict, optimizer, trainer) -> None:
    """The weights are the live model's trainable ones (its adapter, with its settings), and
    the optimizer state is one for them, in the order Trainer's optimizer holds them."""
    model = trainer.model
    if hasattr(model, "peft_config"):
        from peft import get_peft_model_state_dict

        live = get_peft_model_state_dict(model)
        _same_tensors(tensors, live, weights.name, exact=True)
        saved_config = _json(path / "adapter_config.json")
        live_config = model.peft_config["default"].to_dict()
        if differ := _differ(saved_config, live_config):
            raise CheckpointRefused(f"adapter_config.json differs from this run's in {differ[:3]}")
    else:
        _same_tensors(tensors, model.state_dict(), weights.name, exact=False)
    if not isinstance(optimizer, dict) or optimizer.keys() != {"state", "param_groups"}:
        raise CheckpointRefused(f"{OPTIMIZER} is not an optimizer state dict")
    decay = set(trainer.get_decay_parameter_names(model))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [[p for n, p in named if n in decay], [p for n, p in named if n not in decay]]
    sizes = [len(g["params"]) for g in optimizer["param_groups"]]
    if sizes != [len(g) for g in groups]:
        raise CheckpointRefused(f"{OPTIMIZER} holds groups of {sizes} parameters, not this run's")
    ordered = [p for group in groups for p in group]
    for index, entry in optimizer["state"].items():
        if type(index) is not int or not 0 <= index < len(ordered):
            raise CheckpointRefused(f"{OPTIMIZER} has state for parameter {index!r}")
        for key, value in entry.items():
            if value.ndim and value.shape != ordered[index].shape:
                raise CheckpointRefused(f"{OPTIMIZER}'s {key} of parameter {index} has shape "
                                        f"{list(value.shape)}, not {list(ordered[index].shape)}")  # fmt: skip


def _same_tensors(saved: dict, live: dict, name: str, exact: bool) -> None:
    extra = sorted(saved.keys() - live.keys())
    missing = sorted(live.keys() - saved.keys()) if exact else []
    if extra or missing:
        raise CheckpointRefused(f"{name} is not this model's: {(extra + missing)[:3]}")
    for key, tensor in saved.items():
        if tensor.shape != live[key].shape or not tensor.dtype.is_floating_point:
            raise CheckpointRefused(f"{name}: {key} is {tensor.dtype} {list(tensor.shape)}")


def _differ(saved, live: dict) -> list[str]:
    """The keys whose values differ (lists compared as sets: PEFT saves sets as lists)."""
    if not isinstance(saved, dict):
        return ["(not a JSON object)"]
    keys = (saved.keys() | live.keys()) - ADAPTER_VOLATILE
    return sorted(k for k in keys if _plain(saved.get(k)) != _plain(live.get(k)))


def _plain(value):
    if isinstance(value, set | list | tuple):
        return sorted(map(repr, map(_plain, value)))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
