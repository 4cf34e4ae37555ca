"""Checks that run before any model is loaded: one clear line per problem.

`validate` raises ConfigError naming the parameter, its value and the rule it breaks, and
returns the warnings (legal but suspicious settings) for the caller to log. The sweeper runs
it on every point of a search space before the first trial starts.
"""

from __future__ import annotations

import functools
import json
import struct
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from records.metrics import is_finite_number
from trainer.base.config import BACKENDS, LOSS_NAMES, SCALE_REWARDS, config_dir
from trainer.base.errors import ConfigError
from trainer.rl.pipeline_settings import check as pipeline_rules
from trainer.run.lr import LR_EXPONENTS, LR_SCHEDULES
from trainer.sampling.protocol import SAMPLERS

__all__ = ["ConfigError", "validate"]

# model.dtype: torch dtypes a model loads in; float64 is for numerical checks (rounding ruled out)
DTYPES = ("float32", "float64", "bfloat16", "float16")


@functools.cache
def loss_preset(name: str) -> dict[str, Any]:
    """What conf/loss/<name>.yaml sets apart from LossConfig's defaults: {"loss.<key>": value}.
    A loss's own values live in its preset only (trainer/rl/losses.py)."""
    preset = OmegaConf.to_container(OmegaConf.load(Path(config_dir()) / "loss" / f"{name}.yaml"))
    return {
        f"loss.{key}": value for key, value in preset.items() if key not in ("defaults", "name")
    }


def _fail(name: str, value: Any, rule: str) -> None:
    raise ConfigError(f"{name}={value!r}: {rule}")


def _require(ok: bool, name: str, value: Any, rule: str) -> None:
    if not ok:
        _fail(name, value, rule)


def validate(cfg: DictConfig) -> list[str]:
    """Raise ConfigError on the first impossible setting; return warnings for odd ones."""
    warnings: list[str] = []
    _check_backend(cfg)
    _check_sampling(cfg)
    _check_batch(cfg)
    _check_learner_memory(cfg)
    _check_pipeline(cfg)
    _check_optimisation(cfg, warnings)
    _check_kl_and_loss(cfg, warnings)
    _check_paths(cfg)
    _check_model(cfg)
    _check_task(cfg)
    return warnings


def _check_backend(cfg: DictConfig) -> None:
    """The checks every backend shares; a backend's own follow (trainer/backends/)."""
    name = cfg.backend.name
    _require(name in BACKENDS, "backend.name", name, f"must be one of {BACKENDS}")
    processes = cfg.backend.processes
    _require(processes >= 1, "backend.processes", processes, "must be >= 1")
    _require(
        name != "ours" or processes == 1,
        "backend.processes",
        processes,
        "backend=ours trains in one process: use backend=trl for a run over several",
    )
    _require(
        name != "ours" or not cfg.backend.grpo,
        "backend.grpo",
        dict(cfg.backend.grpo),
        "TRL's GRPOConfig options apply to backend=trl only",
    )


def _check_sampling(cfg: DictConfig) -> None:
    t = cfg.temperature
    _require(0 < t < 10, "temperature", t, "must be in (0, 10); 0.6-1.0 is typical")
    _require(0 < cfg.top_p <= 1, "top_p", cfg.top_p, "must be in (0, 1]; 1.0 turns it off")
    _require(cfg.top_k >= 0, "top_k", cfg.top_k, "must be >= 0; 0 turns it off")
    _require(0 <= cfg.min_p < 1, "min_p", cfg.min_p, "must be in [0, 1); 0 turns it off")
    rp = cfg.repetition_penalty
    _require(rp > 0, "repetition_penalty", rp, "must be > 0; 1.0 turns it off")
    _require(cfg.max_tokens >= 1, "max_tokens", cfg.max_tokens, "must be >= 1")
    name = cfg.sampler.name
    _require(name in SAMPLERS, "sampler.name", name, f"must be one of {SAMPLERS}")
    tokens = cfg.sampler.batch_tokens
    _require(tokens >= 1, "sampler.batch_tokens", tokens, "must be >= 1")


def _check_batch(cfg: DictConfig) -> None:
    _require(cfg.batch_size >= 1, "batch_size", cfg.batch_size, "must be >= 1")
    _require(
        cfg.group_size >= 2,
        "group_size",
        cfg.group_size,
        "must be >= 2: advantages are centred within a group, so one rollout has no signal",
    )
    _require(cfg.num_substeps >= 1, "num_substeps", cfg.num_substeps, "must be >= 1")
    _require(
        cfg.batch_size % cfg.num_substeps == 0,
        "num_substeps",
        cfg.num_substeps,
        f"batch_size={cfg.batch_size} must be divisible by num_substeps "
        "(each minibatch holds whole groups)",
    )
    _require(cfg.max_steps >= 1, "max_steps", cfg.max_steps, "must be >= 1")
    _require(cfg.eval_every >= 0, "eval_every", cfg.eval_every, "must be >= 0; 0: at the end")
    _require(cfg.eval_samples >= 1, "eval_samples", cfg.eval_samples, "must be >= 1")
    _require(cfg.save_every >= 0, "save_every", cfg.save_every, "must be >= 0; 0 turns it off")


def _check_learner_memory(cfg: DictConfig) -> None:
    tokens = cfg.learner_batch_tokens
    _require(
        tokens == "auto" or (is_finite_number(tokens) and tokens == int(tokens) and tokens >= 1),
        "learner_batch_tokens",
        tokens,
        "must be auto or an integer >= 1 (the most tokens a learner micro-batch holds)",
    )


def _check_pipeline(cfg: DictConfig) -> None:
    for ok, name, value, rule in pipeline_rules(cfg):
        _require(ok, name, value, rule)


def _check_optimisation(cfg: DictConfig, warnings: list[str]) -> None:
    lr = cfg.lr
    if lr == "auto":
        family = cfg.model.family
        _require(
            family in LR_EXPONENTS,
            "model.family",
            family,
            f"lr=auto needs a calibrated family: one of {sorted(LR_EXPONENTS)}",
        )
    else:
        _require(is_finite_number(lr), "lr", lr, 'must be a number or "auto"')
        _require(lr > 0, "lr", lr, "must be > 0")
        if not 1e-7 <= lr <= 1:
            warnings.append(f"lr={lr} is outside [1e-7, 1]: almost certainly too small or large")
    _require(
        cfg.lr_reference_batch_size >= 1,
        "lr_reference_batch_size",
        cfg.lr_reference_batch_size,
        "must be >= 1",
    )
    sched = cfg.lr_schedule
    _require(sched in LR_SCHEDULES, "lr_schedule", sched, f"must be one of {tuple(LR_SCHEDULES)}")
    _require(cfg.warmup_steps >= 0, "warmup_steps", cfg.warmup_steps, "must be >= 0")
    _require(cfg.max_grad_norm >= 0, "max_grad_norm", cfg.max_grad_norm, "must be >= 0")
    _require(cfg.lora_rank >= 0, "lora_rank", cfg.lora_rank, "must be >= 0; 0: full fine-tune")
    _require(cfg.lora_alpha > 0, "lora_alpha", cfg.lora_alpha, "must be > 0")
    _require(0 <= cfg.lora_dropout < 1, "lora_dropout", cfg.lora_dropout, "must be in [0, 1)")
    dtype = cfg.model.dtype
    _require(dtype in DTYPES, "model.dtype", dtype, f"must be one of {DTYPES}")
    threads = cfg.model.threads
    _require(
        threads == "auto" or (type(threads) is int and threads >= 1),
        "model.threads",
        threads,
        "must be auto or a whole number >= 1",
    )


def _check_kl_and_loss(cfg: DictConfig, warnings: list[str]) -> None:
    coef = cfg.kl_penalty_coef
    _require(coef >= 0, "kl_penalty_coef", coef, "must be >= 0; 0 turns the penalty off")
    gamma = cfg.kl_discount_factor
    _require(0 <= gamma <= 1, "kl_discount_factor", gamma, "must be in [0, 1]")
    _require(cfg.kl_threshold > 0, "kl_threshold", cfg.kl_threshold, "must be > 0")
    scale = cfg.scale_rewards
    _require(scale in SCALE_REWARDS, "scale_rewards", scale, f"must be one of {SCALE_REWARDS}")
    name = cfg.loss.name
    _require(name in LOSS_NAMES, "loss.name", name, f"must be one of {sorted(LOSS_NAMES)}")
    low, high = cfg.loss.clip_low, cfg.loss.clip_high
    _require(0 < low <= 1, "loss.clip_low", low, "must be in (0, 1]")
    _require(high >= 1, "loss.clip_high", high, "must be >= 1")
    # On backend=trl, loss.name is TRL's loss_type, whose default is dapo with TRL's own
    # epsilon (conf/loss/trl_default.yaml): DAPO's recipe is advice for ours only.
    if name == "dapo" and cfg.backend.name == "ours":
        for key, recommended in loss_preset("dapo").items():
            value = cfg.loss[key.split(".")[1]]
            if value != recommended:
                warnings.append(f"{key}={value}: DAPO recommends {recommended}")
        if coef != 0:
            warnings.append(f"kl_penalty_coef={coef}: DAPO recommends 0 (no KL term)")


def _check_paths(cfg: DictConfig) -> None:
    path = cfg.model.path
    if path is not None:
        _require(
            Path(path).expanduser().is_dir(),
            "model.path",
            path,
            "must be a Hugging Face model directory that exists",
        )
    task_path = cfg.task.get("path") if isinstance(cfg.task, DictConfig) else None
    if task_path is not None:
        _require(
            Path(task_path).expanduser().exists(),
            "task.path",
            task_path,
            "no such file or directory",
        )


# What a model directory's weights may be: one safetensors file, its shard index, or a pickle
# file (read by transformers itself, never here).
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def _check_model(cfg: DictConfig) -> None:
    """A model directory that loads: its config and tokenizer read (cheap, so done here, once
    per directory), a weights file whose header reads, and a chat template if one is asked
    for. The tiny model is built by us and needs none of this."""
    path = cfg.model.path
    if path is None:
        return
    problem = _model_problem(str(Path(path).expanduser()))
    if problem:
        _fail("model.path", path, problem)
    if cfg.task.get("chat_template") is True and not _has_chat_template(str(path)):
        _fail("task.chat_template", True, f"the tokenizer of model.path={path!r} has none")


@functools.cache
def _model_problem(path: str) -> str | None:
    """Why the model directory cannot load, or None."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return "no config.json there: not a Hugging Face model directory"
    try:
        json.loads(config.read_bytes())
    except (ValueError, OSError) as e:
        return f"config.json does not read ({_first_line(e)})"
    weights = [Path(path) / name for name in WEIGHTS if (Path(path) / name).is_file()]
    if not weights:
        return f"no weights there (one of {', '.join(WEIGHTS)})"
    try:
        _check_weights(weights[0])
    except Exception as e:  # a hostile header can make the parse raise anything
        return f"{weights[0].name} does not read ({_first_line(e)})"
    # transformers only now: the checks above and every other setting cost no import of it
    from transformers import AutoConfig, AutoTokenizer

    for what, load in (("config.json", AutoConfig), ("tokenizer", AutoTokenizer)):
        try:
            load.from_pretrained(path)
        except Exception as e:  # whatever transformers raises for a file it cannot use
            return f"its {what} does not load ({_first_line(e)})"
    return None


def _check_weights(file: Path) -> None:
    """A safetensors file's header (or every shard's, through the index) reads and fits the
    file; no tensor is loaded."""
    if file.suffix == ".bin":
        return
    if file.name.endswith(".index.json"):
        shards = set(json.loads(file.read_bytes())["weight_map"].values())
        for shard in sorted(shards):
            _check_weights(file.parent / shard)
        return
    with file.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8).ljust(8, b"\xff"))
        size = file.stat().st_size
        if length > size - 8:
            raise ValueError(f"a header of {length} bytes in a file of {size}")
        header = json.loads(f.read(length))
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
    if not ends or 8 + length + max(ends) > size:
        raise ValueError("its tensors lie past the end of the file (cut short?)")


@functools.cache
def _has_chat_template(path: str) -> bool:
    from transformers import AutoTokenizer

    return getattr(AutoTokenizer.from_pretrained(path), "chat_template", None) is not None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200] if text else ''}"


def _check_task(cfg: DictConfig) -> None:
    """Build the task once, so a bad data file, field, message or reward fails here and not
    inside a trial."""
    from hydra.errors import InstantiationException

    from trainer.env.tasks import make_task

    try:
        make_task(cfg.task)
    except InstantiationException as e:
        cause = e.__cause__
        if isinstance(cause, ConfigError):
            raise cause from None
        target = cfg.task.get("_target_")
        raise ConfigError(
            f"task._target_={target!r}: could not build the task ({cause or e})"
        ) from None
