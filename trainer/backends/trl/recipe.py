"""A `trl grpo --config` YAML as the base of a run: `backend=trl backend.config=recipe.yaml`.

The file is read with TRL's own parser (`TrlParser` over GRPOScriptArguments, GRPOConfig,
ModelConfig and DatasetMixtureConfig, as `trl grpo --config` reads it, TRL's defaults included;
recipe_file.py) and turned into our config (`with_recipe`), so everything downstream (checks, MLflow's params,
training, the tuned file) sees the values the run trains with:

- a GRPOConfig field that a key of ours sets becomes that key (mapping.TABLE's `back`), the
  batch shape becomes batch_size / num_substeps / k, every other field the YAML writes goes to
  `backend.grpo`, and so do TRL's defaults where ours differ (mapping.DEFAULTS: beta, bf16...);
- ModelConfig becomes model.path and lora_* (no PEFT: lora_rank=0; recipe_model.py);
- dataset_name, its splits and reward_funcs become the task (recipe_task.py).

Precedence: a key given on the command line (or in a `+tuned` file) wins over the recipe, the
recipe over our defaults. TRL's names work as overrides too (`backend.grpo.learning_rate`): one
that a key of ours also sets is refused, naming both. Fields the sweep owns (`OWNED`) are
replaced with one line saying so; what it cannot honour is refused in one line naming it.

The way back, the recipe with a trial's tuned values for `trl grpo --config`, is
tuned_recipe.py.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable
from dataclasses import fields
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from trainer.backends.trl.mapping import DEFAULTS, MICRO_BATCHING, TABLE
from trainer.backends.trl.recipe_file import KEY, Recipe, fingerprint, read, refuse
from trainer.backends.trl.recipe_model import model_values
from trainer.base.errors import ConfigError

log = logging.getLogger(__name__)

RECIPE_PARAM = "trl_recipe"  # the MLflow params naming the recipe a run started from
RECIPE_HASH_PARAM = "trl_recipe_sha256"

# GRPOConfig fields the sweep sets whatever the recipe says, and why
OWNED = {
    "output_dir": "one per trial",
    "report_to": "the sweep logs to MLflow",
    "run_name": "the sweep names its runs",
    "seed": "the sweep's seeds: seed=N, hydra.sweeper.seeds",
    "logging_steps": "one log a step of ours",
    "disable_tqdm": "one progress line is ours",
    "eval_strategy": "our evaluator runs every eval_every steps",
    "eval_steps": "our evaluator runs every eval_every steps",
    "save_strategy": "checkpoints every save_every steps",
    "save_steps": "checkpoints every save_every steps",
    "resume_from_checkpoint": "resume=true continues a trial",
    "push_to_hub": "a trial's model is not pushed",
    "remove_unused_columns": "a dataset's columns reach the rewards",
    "ddp_find_unused_parameters": "every LoRA weight gets a gradient",
}
BATCH = ("per_device_train_batch_size", "steps_per_generation", "generation_batch_size")
BATCH += (MICRO_BATCHING, "num_iterations")  # -> batch_size, num_substeps, k
RENAMED = {"gradient_checkpointing": "activation_checkpointing"}  # transformers' old names
BACK = {row.field: row for row in TABLE if row.back is not None and row.field not in OWNED}


def recipe_params(cfg: DictConfig) -> dict[str, str]:
    """What a run's MLflow params say of its recipe (none without one)."""
    path = cfg.backend.get("config")
    if not path:
        return {}
    where, sha = fingerprint(path)
    return {RECIPE_PARAM: where, RECIPE_HASH_PARAM: sha}


# --- which keys the command line set ----------------------------------------------------


def run_overrides(cfg: DictConfig) -> list[str]:
    """The run's Hydra overrides: the composed hydra node's, else the running job's."""
    from hydra.core.hydra_config import HydraConfig

    if "hydra" in cfg:
        return list(cfg.hydra.overrides.task)
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def explicit_keys(overrides: Iterable[str]) -> set[str]:
    """The keys (and config groups) the overrides set, a `+tuned=<study>` file's included."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from records.tuned_file import TUNED_DIR, read_tuned, tuned_path

    keys: set[str] = set()
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.key_or_group
        if override.is_delete() or key.startswith("hydra"):
            continue
        if key == TUNED_DIR:
            groups, values = read_tuned(tuned_path(str(override.value())))
            keys |= set(groups) | set(values)
        else:
            keys.add(key)
    return keys


def _given(key: str, explicit: set[str]) -> bool:
    """Whether the command line set `key`, itself or through its config group (`loss=dapo`
    sets loss.name; `backend=trl` picks the backend, not backend.grpo's values)."""
    return key in explicit or any(key.startswith(e + ".") for e in explicit if e != "backend")


# --- the recipe as our config -------------------------------------------------------------


def with_recipe(cfg: DictConfig, overrides: Iterable[str] | None = None) -> DictConfig:
    """cfg with its recipe's values where the command line set none (cfg itself without a
    recipe). `overrides`: the run's Hydra overrides (default: `run_overrides(cfg)`)."""
    path = cfg.backend.get("config") if "backend" in cfg else None
    if not path:
        return cfg
    if cfg.backend.name != "trl":
        raise ConfigError(f"{KEY}={path!r}: a `trl grpo` recipe needs backend=trl")
    explicit = explicit_keys(run_overrides(cfg) if overrides is None else overrides)
    if "task" in explicit:
        raise ConfigError(f"task: the recipe's dataset_name and reward_funcs are the task ({KEY})")
    recipe = read(path)
    out = copy.deepcopy(cfg)
    with open_dict(out):
        explicit |= _translate_trl_names(out, explicit)
        values = recipe_values(recipe, explicit, cfg)
        task = {**values.pop("task"), **_given_task(cfg, explicit)}
        OmegaConf.update(out, "task", task, merge=False)
        for key, value in values.items():
            OmegaConf.update(out, key, value, merge=False)
    return out


def _translate_trl_names(cfg: DictConfig, explicit: set[str]) -> set[str]:
    """`backend.grpo.<TRL name>` overrides as our keys; returns the keys they set. Idempotent:
    a name already translated still marks its key as set."""
    ours: set[str] = set()
    for key in sorted(explicit):
        name = key.removeprefix("backend.grpo.")
        if name == key or name not in BACK:
            continue
        row = BACK[name]
        if _given(row.key, explicit):
            raise ConfigError(f"{key} and {row.key}: both set {name}; give one of them")
        ours.add(row.key)
        if name in cfg.backend.grpo:
            value = row.back(cfg.backend.grpo.pop(name), int(cfg.num_substeps))
            OmegaConf.update(cfg, row.key, value, merge=False)
    return ours


def _given_task(cfg: DictConfig, explicit: set[str]) -> dict[str, Any]:
    """The task.* keys the command line set (task.eval_fraction=0.2, task.reward_timeout...)."""
    given = {}
    for key in explicit:
        if key.startswith("task.") and OmegaConf.select(cfg, key) is not None:
            value = OmegaConf.select(cfg, key)
            given[key.removeprefix("task.")] = (
                OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
            )
    return given


def recipe_values(recipe: Recipe, explicit: set[str], cfg: DictConfig) -> dict[str, Any]:
    """Our dotted keys -> the recipe's values, for the keys the command line did not set;
    `task` is the whole task node."""
    g = recipe.grpo
    values: dict[str, Any] = {}

    def put(key: str, value) -> None:
        if not _given(key, explicit):
            values[key] = value() if callable(value) else value

    substeps = _batch(recipe, explicit, cfg, put)
    for name, row in BACK.items():
        if name == "epsilon_high" and g.epsilon_high is None:  # TRL's loss uses epsilon then
            put(row.key, 1 + g.epsilon)
        elif name == "max_steps" and g.max_steps <= 0:
            put(row.key, lambda: _by_epochs(g))
        else:
            put(row.key, lambda row=row: row.back(getattr(g, row.field), substeps))
    for row in DEFAULTS:  # TRL's defaults, where ours would otherwise differ
        if row.field not in OWNED:
            put(f"backend.grpo.{row.field}", plain(getattr(g, row.field)))
    mapped = {row.field for row in TABLE} | {row.field for row in DEFAULTS} | set(BATCH)
    grpo_names = {f.name for f in fields(g)}
    for name in recipe.written:
        if name in grpo_names and name not in mapped | set(OWNED) | set(RENAMED):
            put(f"backend.grpo.{name}", plain(getattr(g, name)))
    from trainer.backends.trl.recipe_task import task_values

    model_values(recipe, put)
    values["task"] = task_values(recipe, cfg)
    return values


def _batch(recipe: Recipe, explicit: set[str], cfg: DictConfig, put) -> int:
    """batch_size, num_substeps and k from the recipe's batch shape; returns num_substeps."""
    g = recipe.grpo
    if g.num_iterations != 1:
        raise refuse("num_iterations", g.num_iterations, "a sweep trains one epoch over each batch")
    k = int(g.gradient_accumulation_steps)
    if g.steps_per_generation % k:
        raise refuse(
            "steps_per_generation",
            g.steps_per_generation,
            f"must be a multiple of gradient_accumulation_steps ({k})",
        )
    rollouts = g.per_device_train_batch_size * g.steps_per_generation * cfg.backend.processes
    if rollouts % g.num_generations:
        raise refuse(
            "generation_batch_size",
            rollouts,
            f"must be a multiple of num_generations ({g.num_generations})",
        )
    put("batch_size", rollouts // g.num_generations)
    put("num_substeps", g.steps_per_generation // k)
    put(f"backend.grpo.{MICRO_BATCHING}", k)
    given = _given("num_substeps", explicit)
    return int(cfg.num_substeps) if given else g.steps_per_generation // k


def _by_epochs(g) -> None:
    raise refuse(
        "max_steps",
        g.max_steps,
        f"a sweep trains a set number of steps, not num_train_epochs={g.num_train_epochs}; "
        "set max_steps in the recipe, or max_steps=N (steps of ours)",
    )


def plain(value: Any) -> Any:
    """A parsed value as OmegaConf holds it (TRL's enums as their names)."""
    return getattr(value, "value", value)


def notes(cfg: DictConfig) -> list[str]:
    """The run's lines about its recipe: where the objective is read, and the fields the
    sweep set in place of the recipe's."""
    from trainer.backends.trl.recipe_task import eval_source

    path = cfg.backend.get("config")
    if not path:
        return []
    lines = [
        f"{KEY}: the objective is our evaluator with the recipe's rewards on "
        f"{eval_source(cfg.task)}"
    ]
    replaced = [f"{name} ({why})" for name, why in OWNED.items() if name in read(path).written]
    if replaced:
        lines.append(f"{KEY}: the sweep sets {'; '.join(replaced)} in place of the recipe's")
    return lines
