"""Our keys onto TRL's GRPOConfig: the one table, and the checks that refuse what it cannot map.

One step of ours is one sampling round of batch_size x group_size rollouts followed by
num_substeps optimizer steps; TRL's global_step counts optimizer steps. So every count in steps
is multiplied by num_substeps, and a step of ours is `num_substeps` of TRL's. k is the
micro-batching choice (`backend.grpo.gradient_accumulation_steps`, default 1): each optimizer
step accumulates k micro-batches of `per_device_train_batch_size` rollouts per process.

`TABLE` rows are set from our keys: a `backend.grpo.<field>` that names one is refused (it would
shadow the key of ours), and so is a key of a dict option that TRL applies over one
(`SHADOWING`: generation_kwargs' sampling keys, model_init_kwargs' dtype). `DEFAULTS` rows keep TRL's own defaults that differ from ours from
leaking in, and a `backend.grpo.<field>` may override them. docs/trl.md's mapping table is
`markdown_table()` (tests/test_trl_backend.py checks they agree).

`validate` loads neither TRL nor transformers: the GRPOConfig field names come from reading
the dataclasses' source (`grpo_fields`), so an unknown option is refused in milliseconds.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from records import metrics as metrics_names
from trainer.base.errors import ConfigError
from trainer.env.reward_model import TARGET as REWARD_MODEL
from trainer.env.rewards import STYLE_TRL, is_trl_style
from trainer.run.lr import LR_SCHEDULES

MICRO_BATCHING = "gradient_accumulation_steps"  # k: a backend.grpo option that is ours to read
LOSSES = ("grpo", "dr_grpo", "bnpo", "dapo")  # loss.name with the same meaning in TRL


@dataclass(frozen=True)
class Inputs:
    """What a row's value is computed from: the config, the resolved lr, k."""

    cfg: DictConfig
    lr: float
    k: int = 1

    @property
    def substeps(self) -> int:
        return int(self.cfg.num_substeps)


@dataclass(frozen=True)
class Row:
    field: str  # GRPOConfig's field
    ours: str  # the keys of ours it is set from ("" for a backend default)
    value: Callable[[Inputs], Any]
    note: str = ""
    # TRL's value back to our key's (a recipe's value, trainer/backends/trl/recipe.py): given
    # the field's value and num_substeps. None: not a one-key row, or the sweep owns it.
    back: Callable[[Any, int], Any] | None = None

    @property
    def key(self) -> str:
        """The key of ours that `back` sets: the first of `ours`."""
        return self.ours.split(", ")[0]


def rollouts_per_update(x: Inputs) -> int:
    """per_device_train_batch_size: a step's rollouts over its optimizer steps, micro-batches
    and processes."""
    cfg = x.cfg
    return cfg.batch_size * cfg.group_size // (x.substeps * x.k * cfg.backend.processes)


def steps_row(key: str, note: str, least: int) -> Row:
    """A count of steps, the same key on both sides: TRL's in optimizer steps."""
    return Row(
        key,
        key,
        lambda x: x.cfg[key] * x.substeps,
        note,
        back=lambda v, s: in_our_steps(key, v, s, least),
    )


def lr_type(schedule: str) -> str:
    return LR_SCHEDULES[schedule]


TABLE = (
    Row("num_generations", "group_size", lambda x: x.cfg.group_size, back=lambda v, s: v),
    Row(
        "per_device_train_batch_size",
        "batch_size, group_size, num_substeps, backend.processes",
        rollouts_per_update,
        "batch_size x group_size / (num_substeps x k x processes); generation_batch_size "
        "follows as batch_size x group_size (TRL refuses it beside steps_per_generation)",
    ),
    Row(
        "steps_per_generation",
        "num_substeps",
        lambda x: x.substeps * x.k,
        "num_substeps x k. TRL shuffles the batch's rollouts one by one before splitting it, "
        "so with num_substeps > 1 a minibatch holds parts of groups, where ours holds whole "
        "groups; the advantages are computed over whole groups in both",
    ),
    Row(MICRO_BATCHING, "(k)", lambda x: x.k, "k, backend.grpo.gradient_accumulation_steps"),
    Row("num_iterations", "num_substeps", lambda x: 1, "one epoch over each batch"),
    steps_row("max_steps", "x num_substeps", least=1),
    Row("logging_steps", "num_substeps", lambda x: x.substeps, "one log a step of ours"),
    Row(
        "save_strategy",
        "save_every",
        lambda x: "steps" if x.cfg.save_every else "no",
        "TRL's checkpoint-<global_step> folders in output_dir",
    ),
    Row(
        "save_steps",
        "save_every",
        lambda x: max(1, x.cfg.save_every) * x.substeps,
        "x num_substeps",
    ),
    Row(
        "eval_strategy",
        "eval_every",
        lambda x: "no",
        "our evaluator runs from a callback at step 0 and every eval_every steps of ours",
    ),
    Row("output_dir", "output_dir", lambda x: str(x.cfg.output_dir)),
    Row(
        "learning_rate",
        "lr, lr_batch_scaling, model.family",
        lambda x: x.lr,
        "lr=auto and sqrt batch scaling resolved as on ours",
        back=lambda v, s: float(v),
    ),
    Row(
        "lr_scheduler_type",
        "lr_schedule",
        lambda x: lr_type(x.cfg.lr_schedule),
        back=lambda v, s: lr_schedule_of(v),
    ),
    steps_row(
        "warmup_steps",
        "x num_substeps (TRL moves lr every optimizer step, ours every step)",
        least=0,
    ),
    Row(
        "max_grad_norm",
        "max_grad_norm",
        lambda x: x.cfg.max_grad_norm,
        "0 turns it off in both",
        back=lambda v, s: float(v),
    ),
    Row("seed", "seed", lambda x: x.cfg.seed),
    Row(
        "loss_type",
        "loss.name",
        lambda x: x.cfg.loss.name,
        "backend=trl trains with TRL's default, dapo (token mean; our default "
        "importance_sampling has no TRL equivalent): its gradient is about 1/length of ours, so "
        "max_grad_norm clips it less (measured: docs/trl.md, 'One lr, two gradient scales'); "
        "a recipe's loss_type",
        back=lambda v, s: str(v),
    ),
    Row(
        "epsilon",
        "loss.clip_low",
        lambda x: 1 - x.cfg.loss.clip_low,
        "1 - clip_low",
        back=lambda v, s: 1 - v,
    ),
    Row(
        "epsilon_high",
        "loss.clip_high",
        lambda x: x.cfg.loss.clip_high - 1,
        "clip_high - 1",
        back=lambda v, s: None if v is None else 1 + v,  # None: TRL's epsilon (recipe.py)
    ),
    Row(
        "mask_truncated_completions",
        "loss.mask_truncated_completions",
        lambda x: x.cfg.loss.mask_truncated_completions,
        back=lambda v, s: bool(v),
    ),
    Row(
        "scale_rewards",
        "scale_rewards",
        lambda x: x.cfg.scale_rewards,
        back=lambda v, s: {True: "group", False: "none"}.get(v, v),  # as TRL reads a bool
    ),
    Row(
        "reward_weights",
        "task.reward_weights",
        lambda x: None,
        "the task's RewardSet weights",
        back=lambda v, s: None if v is None else [float(w) for w in v],
    ),
    Row("temperature", "temperature", lambda x: x.cfg.temperature, back=lambda v, s: float(v)),
    Row("top_p", "top_p", lambda x: x.cfg.top_p, back=lambda v, s: float(v)),
    Row(
        "top_k", "top_k", lambda x: x.cfg.top_k, "0 turns it off in both", lambda v, s: int(v or 0)
    ),
    Row(
        "min_p",
        "min_p",
        lambda x: x.cfg.min_p or None,
        "0 (ours) is None (TRL): off",
        lambda v, s: float(v or 0.0),
    ),
    Row(
        "repetition_penalty",
        "repetition_penalty",
        lambda x: x.cfg.repetition_penalty,
        back=lambda v, s: float(v),
    ),
    Row(
        "max_completion_length",
        "max_tokens",
        lambda x: x.cfg.max_tokens,
        back=lambda v, s: int(v),
    ),
    Row(
        "activation_checkpointing",
        "gradient_checkpointing",
        lambda x: x.cfg.gradient_checkpointing,
        "TRL's default is on; transformers' new name (the old one warns)",
        back=lambda v, s: bool(v),
    ),
    Row(
        "use_cpu",
        "model.device",
        lambda x: x.cfg.model.device == "cpu" or not cuda_available(),
        "auto: cuda when present",
        back=lambda v, s: "cpu" if v else "auto",
    ),
)

DEFAULTS = (
    Row("beta", "", lambda x: 0.0, "no KL loss term (kl_penalty_coef > 0 is refused)"),
    Row("bf16", "", lambda x: False, "float32 training, as model.dtype=float32"),
    Row("fp16", "", lambda x: False, "float32 training"),
    Row("weight_decay", "", lambda x: 0.0, "as our AdamW"),
    Row("shuffle_dataset", "", lambda x: False, "the problems in the order ours draws them"),
    Row("remove_unused_columns", "", lambda x: False, "a dataset's columns reach the rewards"),
    Row("report_to", "", lambda x: "none", "the sweeper's reporter logs to MLflow"),
    Row("disable_tqdm", "", lambda x: True, "one progress line is ours"),
    Row(
        "ddp_find_unused_parameters",
        "",
        lambda x: False,
        "every LoRA weight gets a gradient: no extra autograd pass a step (processes > 1)",
    ),
)


def in_our_steps(field: str, value: Any, substeps: int, least: int) -> int:
    """A count of TRL's optimizer steps as steps of ours (num_substeps of TRL's each)."""
    if isinstance(value, float) and not value.is_integer():
        raise ConfigError(f"{field}={value!r}: backend=trl needs a whole number of steps here")
    if int(value) < least or int(value) % substeps:
        raise ConfigError(
            f"{field}={value!r}: backend=trl needs a multiple of num_substeps ({substeps}), "
            f"at least {least}, to count it in steps of ours"
        )
    return int(value) // substeps


def lr_schedule_of(scheduler: Any) -> str:
    """lr_scheduler_type as our lr_schedule (constant: constant_with_warmup from 0 steps)."""
    name = str(getattr(scheduler, "value", scheduler))
    ours = {trl: key for key, trl in LR_SCHEDULES.items()} | {"constant": "constant"}
    if name not in ours:
        raise ConfigError(f"lr_scheduler_type={name!r}: backend=trl runs one of {sorted(ours)}")
    return ours[name]


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def grpo_kwargs(cfg: DictConfig, lr: float) -> dict[str, Any]:
    """GRPOConfig's keyword arguments: the table, the defaults, then backend.grpo."""
    passed = OmegaConf.to_container(cfg.backend.grpo, resolve=True)
    x = Inputs(cfg, lr, int(passed.get(MICRO_BATCHING, 1)))
    kwargs = {row.field: row.value(x) for row in TABLE + DEFAULTS}
    kwargs.update(passed)
    return kwargs


def markdown_table() -> str:
    """docs/trl.md's mapping table."""
    lines = ["| GRPOConfig field | from our key | how, and where it differs |", "|---|---|---|"]
    for row in TABLE + DEFAULTS:
        ours = f"`{row.ours}`" if row.ours else "(backend default; `backend.grpo` may override)"
        lines.append(f"| `{row.field}` | {ours} | {row.note} |")
    return "\n".join(lines)


# TRL's logged name -> ours, where the meaning is the same; the rest go under `trl/<name>`.
SAME_MEANING = {
    "reward": metrics_names.REWARD,
    "reward_std": metrics_names.REWARD_STD,
    "entropy": metrics_names.ENTROPY,
    "kl": metrics_names.KL_POLICY_REF,  # TRL's beta term: the policy vs its reference
    "loss": metrics_names.LOSS,
    "grad_norm": metrics_names.GRAD_NORM,
    "learning_rate": metrics_names.LR,
    metrics_names.COMPLETION_LENGTH: metrics_names.COMPLETION_LENGTH,  # TRL logs it as we do
    "completions/clipped_ratio": metrics_names.COMPLETIONS_TRUNCATED,  # cut at max length
}
TRL_PREFIX = "trl/"
TRAIN_SUMMARY = "train_runtime"  # in the log TRL writes once training ended: not a step's


def our_metrics(logs: dict[str, float]) -> dict[str, float]:
    """TRL's logs under our names; a value TRL logged as None (nothing to average) is left
    out, never reported as 0. Not `frac_reward_zero_std` as the groups' shares: with
    scale_rewards=batch it is one batch-level 0/1 flag (`group_rewards` gives them)."""
    metrics: dict[str, float] = {}
    for name, value in logs.items():
        if value is None or isinstance(value, str):
            continue
        if name.startswith("rewards/") and name.endswith("/mean"):
            metrics[metrics_names.reward_part(name.split("/")[1])] = value
        metrics[SAME_MEANING.get(name, TRL_PREFIX + name)] = float(value)
    return metrics


def logged_as_ours(name: str) -> str:
    """A metric name as logged to MLflow, by TRL's `report_to` or by us, under our name."""
    if name.startswith("rewards/") and name.endswith("/mean"):
        return metrics_names.reward_part(name.split("/")[1])
    return SAME_MEANING.get(name, name)


# --- the checks -------------------------------------------------------------------------


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


def trl_style_indices(task_cfg: Any) -> list[int]:
    """Which task.rewards entries are TRL-style (`style: trl`)."""
    return [i for i, entry in enumerate(_reward_entries(task_cfg)) if is_trl_style(entry)]


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


if __name__ == "__main__":
    print(markdown_table())
