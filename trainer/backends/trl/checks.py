"""The checks that refuse what backend=trl cannot run as we mean it (`validate`, one line
each): our options TRL has no equivalent of, the batch shape, the rewards, and each
`backend.grpo.<field>` (mapping.TABLE's own fields are refused, as is a key of a dict option
that TRL applies over one: `SHADOWING`, generation_kwargs' sampling keys, model_init_kwargs'
dtype).

`validate` loads neither TRL nor transformers: the GRPOConfig field names come from reading
the dataclasses' source (`grpo_fields`), so an unknown option is refused in milliseconds.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import json
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from trainer.backends.trl.mapping import LOSSES, MICRO_BATCHING, TABLE
from trainer.base.errors import ConfigError
from trainer.env.reward_model import TARGET as REWARD_MODEL
from trainer.env.trl_rewards import STYLE_TRL


def _refuse(key: str, value: Any, rule: str) -> None:
    raise ConfigError(f"{key}={value!r}: backend=trl {rule}")


def validate(cfg: DictConfig) -> list[str]:
    """Refuse what TRL cannot run as we mean it (one line each); no TRL import."""
    if cfg.kl_penalty_coef > 0:
        _refuse(
            "kl_penalty_coef",
            cfg.kl_penalty_coef,
            "cannot: ours folds the KL into the advantage, TRL's beta is a loss term; "
            "sweep backend.grpo.beta instead",
        )
    if cfg.kl_discount_factor > 0:
        _refuse("kl_discount_factor", cfg.kl_discount_factor, "has no discounted KL")
    if cfg.pipeline != "sync":
        _refuse("pipeline", cfg.pipeline, "samples then trains (sync) only")
    if cfg.loss.name not in LOSSES:
        _refuse("loss.name", cfg.loss.name, f"has no equivalent; one of {LOSSES}")
    if cfg.model.dtype != "float32":
        _refuse(
            "model.dtype",
            cfg.model.dtype,
            "trains float32 weights: use model.dtype=float32, and backend.grpo.bf16=true for "
            "TRL's mixed precision",
        )
    if cfg.sampler.name != "torch":
        _refuse(
            "sampler.name", cfg.sampler.name, "samples with TRL's generation: backend.grpo.use_vllm"
        )
    if cfg.remove_constant_reward_groups:
        _refuse("remove_constant_reward_groups", True, "has no such filter")
    if cfg.learner_batch_tokens != "auto":
        _refuse(
            "learner_batch_tokens",
            cfg.learner_batch_tokens,
            "micro-batches by rollouts: backend.grpo.gradient_accumulation_steps=k",
        )
    _check_batch(cfg)
    _check_rewards(cfg)
    _check_passed(cfg)
    return []


def _check_batch(cfg: DictConfig) -> None:
    k = cfg.backend.grpo.get(MICRO_BATCHING, 1)
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ConfigError(f"backend.grpo.{MICRO_BATCHING}={k!r}: must be an integer >= 1")
    rollouts = cfg.batch_size * cfg.group_size
    parts = cfg.num_substeps * k * cfg.backend.processes
    if rollouts % parts:
        raise ConfigError(
            f"batch_size={cfg.batch_size}: backend=trl needs batch_size x group_size "
            f"({rollouts}) divisible by num_substeps x {MICRO_BATCHING} x backend.processes "
            f"({parts})"
        )


def _reward_entries(task_cfg: Any) -> list[Any]:
    rewards = task_cfg.get("rewards") if isinstance(task_cfg, DictConfig) else None
    return list(rewards) if OmegaConf.is_list(rewards) else []


def _check_rewards(cfg: DictConfig) -> None:
    for entry in _reward_entries(cfg.task):
        style = entry.get("style") if OmegaConf.is_dict(entry) else None
        if style not in (None, STYLE_TRL):
            raise ConfigError(f"task.rewards: style={style!r}: must be {STYLE_TRL!r} or left out")
        if OmegaConf.is_dict(entry) and entry.get("_target_") == REWARD_MODEL:
            _same_template_kwargs(entry, cfg.backend.grpo)


def _same_template_kwargs(entry: DictConfig, grpo: DictConfig) -> None:
    """TRL templates a reward model's text with GRPOConfig's chat_template_kwargs (data.py
    hands TRL the model), our evaluator with the entry's: the objective needs them equal."""
    trl = _as_dict(grpo.get("chat_template_kwargs"))
    ours = _as_dict(entry.get("chat_template_kwargs"))
    if trl != ours:
        raise ConfigError(
            f"backend.grpo.chat_template_kwargs={trl}: TRL applies them to the reward model "
            f"{entry.get('path')!r}, our evaluator {ours} (its task.rewards entry); give both "
            "the same"
        )


# Keys of a dict option that TRL lets override a field the table sets: GRPOConfig documents
# generation_kwargs as overriding its sampling fields (max_new_tokens is transformers' name for
# the completion length, max_tokens vLLM's); model_init_kwargs' dtype is model.dtype's.
SHADOWING = {
    "generation_kwargs": {
        **{f: f for f in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")},
        "max_new_tokens": "max_completion_length",
        "max_tokens": "max_completion_length",
    },
    "model_init_kwargs": {"dtype": None, "torch_dtype": None},  # None: model.dtype
}


def _as_dict(value: Any) -> dict:
    """A dict option as TRL reads it: a mapping, or its JSON text."""
    if OmegaConf.is_dict(value):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, str) and value.startswith("{"):
        try:
            return json.loads(value)
        except ValueError:
            return {}  # TRL's own error says what is wrong with it
    return {}


def _check_passed(cfg: DictConfig) -> None:
    mapped = {row.field: row.ours for row in TABLE if row.field != MICRO_BATCHING}
    mapped["generation_batch_size"] = "batch_size, group_size"
    known = None
    for key in cfg.backend.grpo:
        if key in mapped:
            raise ConfigError(
                f"backend.grpo.{key}: set from {mapped[key]} on backend=trl; set that instead"
            )
        given = _as_dict(cfg.backend.grpo[key])
        for inner, field in SHADOWING.get(key, {}).items():
            if inner in given:
                ours = mapped[field] if field else "model.dtype"
                _refuse(
                    f"backend.grpo.{key}.{inner}",
                    given[inner],
                    f"sets it from {ours}; set that instead",
                )
        known = known if known is not None else grpo_fields()
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ConfigError(f"backend.grpo.{key}: not an option of TRL's GRPOConfig{hint}")


@cache
def grpo_fields() -> frozenset[str]:
    """GRPOConfig's field names, read from the source of it and its bases (TRL's base config,
    transformers' TrainingArguments) without importing them."""
    sources = (
        ("trl", "trainer/grpo_config.py"),
        ("trl", "trainer/base_config.py"),
        ("transformers", "training_args.py"),
    )
    names: set[str] = set()
    for package, path in sources:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(f"backend=trl: needs the {package} package (pip install '.[trl]')")
        root = Path(next(iter(spec.submodule_search_locations)))
        tree = ast.parse((root / path).read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name in (
                "GRPOConfig",
                "_BaseConfig",
                "TrainingArguments",
            ):
                names.update(
                    item.target.id
                    for item in node.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                )
    return frozenset(names)
