"""Our keys onto TRL's GRPOConfig: the one table (checks.py refuses what it cannot map;
metric_names.py reads TRL's logs under our names).

One step of ours is one sampling round of batch_size x group_size rollouts followed by
num_substeps optimizer steps; TRL's global_step counts optimizer steps. So every count in steps
is multiplied by num_substeps, and a step of ours is `num_substeps` of TRL's. k is the
micro-batching choice (`backend.grpo.gradient_accumulation_steps`, default 1): each optimizer
step accumulates k micro-batches of `per_device_train_batch_size` rollouts per process.

`TABLE` rows are set from our keys: a `backend.grpo.<field>` that names one is refused (it would
shadow the key of ours), and so is a key of a dict option that TRL applies over one
(checks.py's `SHADOWING`: generation_kwargs' sampling keys, model_init_kwargs' dtype).
`DEFAULTS` rows keep TRL's own defaults that differ from ours from leaking in, and a
`backend.grpo.<field>` may override them. docs/trl.md's mapping table is
`markdown_table()` (tests/test_trl_backend.py checks they agree).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from trainer.base.errors import ConfigError
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


if __name__ == "__main__":
    print(markdown_table())
