"""A `trl grpo --config` YAML as the base of a run: `backend=trl backend.config=recipe.yaml`.

The file is read with TRL's own parser (`TrlParser` over GRPOScriptArguments, GRPOConfig,
ModelConfig and DatasetMixtureConfig, as `trl grpo --config` reads it, TRL's defaults included)
and turned into our config (`with_recipe`), so everything downstream (checks, MLflow's params,
training, the tuned file) sees the values the run trains with:

- a GRPOConfig field that a key of ours sets becomes that key (mapping.TABLE's `back`), the
  batch shape becomes batch_size / num_substeps / k, every other field the YAML writes goes to
  `backend.grpo`, and so do TRL's defaults where ours differ (mapping.DEFAULTS: beta, bf16...);
- ModelConfig becomes model.path and lora_* (no PEFT: lora_rank=0);
- dataset_name, its splits and reward_funcs become the task (recipe_task.py).

Precedence: a key given on the command line (or in a `+tuned` file) wins over the recipe, the
recipe over our defaults. TRL's names work as overrides too (`backend.grpo.learning_rate`): one
that a key of ours also sets is refused, naming both. Fields the sweep owns (`OWNED`) are
replaced with one line saying so; what it cannot honour is refused in one line naming it.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any, NoReturn

from omegaconf import DictConfig, OmegaConf, open_dict

from trainer.backends.trl.mapping import DEFAULTS, MICRO_BATCHING, TABLE
from trainer.base.errors import ConfigError

log = logging.getLogger(__name__)

KEY = "backend.config"
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
# ModelConfig fields the run cannot honour, at the values that need nothing
MODEL_AS_IS = {
    "model_revision": "main",
    "attn_implementation": None,
    "lora_target_parameters": None,
    "lora_modules_to_save": None,
    "lora_task_type": "CAUSAL_LM",
    "use_rslora": False,
    "use_dora": False,
    "load_in_8bit": False,
    "load_in_4bit": False,
}


@dataclass(frozen=True)
class Recipe:
    path: str  # absolute
    sha256: str
    written: dict[str, Any]  # the YAML as written: the fields the user set
    script: Any  # GRPOScriptArguments
    grpo: Any  # GRPOConfig, TRL's defaults included
    model: Any  # ModelConfig
    mixture: Any  # DatasetMixtureConfig


def _refuse(field: str, value: Any, rule: str) -> ConfigError:
    return ConfigError(f"{field}={value!r}: {rule} ({KEY})")


def fingerprint(path: str) -> tuple[str, str]:
    """(absolute path, sha256 of its bytes) of a recipe file."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"{KEY}={path!r}: no such file")
    return str(file.resolve()), hashlib.sha256(file.read_bytes()).hexdigest()


def recipe_params(cfg: DictConfig) -> dict[str, str]:
    """What a run's MLflow params say of its recipe (none without one)."""
    path = cfg.backend.get("config")
    if not path:
        return {}
    where, sha = fingerprint(path)
    return {RECIPE_PARAM: where, RECIPE_HASH_PARAM: sha}


def read(path: str) -> Recipe:
    return _parse(*fingerprint(path))


@cache
def _parse(path: str, sha256: str) -> Recipe:
    import yaml

    written = yaml.safe_load(Path(path).read_text())
    if not isinstance(written, dict):
        raise ConfigError(f"{KEY}={path!r}: must be a YAML mapping, as `trl grpo --config` reads")
    if "env" in written:
        raise _refuse("env", written["env"], "not set by a sweep; export the variables instead")
    from trl import DatasetMixtureConfig, GRPOConfig, ModelConfig, TrlParser
    from trl.scripts.grpo import GRPOScriptArguments

    parser = TrlParser((GRPOScriptArguments, GRPOConfig, ModelConfig, DatasetMixtureConfig))
    parser.error = _argparse_refusal(written)  # argparse would print its usage and exit
    with warnings.catch_warnings():  # TRL's own defaults use transformers' deprecated names
        warnings.simplefilter("ignore", FutureWarning)
        try:
            *parsed, unknown = parser.parse_args_and_config(
                ["--config", path], return_remaining_strings=True
            )
        except ConfigError:
            raise
        except (ValueError, TypeError) as e:
            message = " ".join(str(e).split())
            field = _named_by(message, written)
            if field is not None:
                raise _refuse(field, written[field], f"TRL refuses it: {message}") from None
            raise ConfigError(f"{KEY}={path!r}: TRL refuses it: {message}") from None
    if unknown:
        field = unknown[0].lstrip("-")
        raise _refuse(field, written.get(field), "not an option of `trl grpo`")
    return Recipe(path, sha256, written, *parsed)


def _named_by(message: str, written: dict[str, Any]) -> str | None:
    """The written field whose value an enum's error names ("cosin is not a valid ...")."""
    if "is not a valid" not in message:
        return None
    for name, value in written.items():
        if isinstance(value, str) and message.lstrip("'").startswith(value):
            return name
    return None


def _argparse_refusal(written: dict[str, Any]):
    """argparse's error (a value its type or choices refuse) as our one line naming the field."""

    def error(message: str) -> NoReturn:
        field = message.removeprefix("argument --").split(":", 1)[0].split("/")[0]
        if field in written:
            raise _refuse(field, written[field], f"TRL refuses it: {message.split(': ', 1)[-1]}")
        raise ConfigError(f"{KEY}: TRL refuses it: {message}")

    return error


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
            put(f"backend.grpo.{row.field}", _plain(getattr(g, row.field)))
    mapped = {row.field for row in TABLE} | {row.field for row in DEFAULTS} | set(BATCH)
    grpo_names = {f.name for f in fields(g)}
    for name in recipe.written:
        if name in grpo_names and name not in mapped | set(OWNED) | set(RENAMED):
            put(f"backend.grpo.{name}", _plain(getattr(g, name)))
    _model(recipe, put)
    values["task"] = _task(recipe, cfg)
    return values


def _batch(recipe: Recipe, explicit: set[str], cfg: DictConfig, put) -> int:
    """batch_size, num_substeps and k from the recipe's batch shape; returns num_substeps."""
    g = recipe.grpo
    if g.num_iterations != 1:
        raise _refuse(
            "num_iterations", g.num_iterations, "a sweep trains one epoch over each batch"
        )
    k = int(g.gradient_accumulation_steps)
    if g.steps_per_generation % k:
        raise _refuse(
            "steps_per_generation",
            g.steps_per_generation,
            f"must be a multiple of gradient_accumulation_steps ({k})",
        )
    rollouts = g.per_device_train_batch_size * g.steps_per_generation * cfg.backend.processes
    if rollouts % g.num_generations:
        raise _refuse(
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
    raise _refuse(
        "max_steps",
        g.max_steps,
        f"a sweep trains a set number of steps, not num_train_epochs={g.num_train_epochs}; "
        "set max_steps in the recipe, or max_steps=N (steps of ours)",
    )


def _model(recipe: Recipe, put) -> None:
    m = recipe.model
    for name, as_is in MODEL_AS_IS.items():
        if getattr(m, name) != as_is:
            raise _refuse(name, getattr(m, name), "not honoured by the sweep; leave it out")
    path = m.model_name_or_path
    if not path or not Path(path).expanduser().is_dir():
        raise _refuse(
            "model_name_or_path", path, "must be a local model directory (no hub downloads)"
        )
    put("model.path", str(Path(path).expanduser()))
    put("model.dtype", lambda: _dtype(m.dtype, path))
    put("lora_rank", m.lora_r if m.use_peft else 0)
    put("lora_alpha", m.lora_alpha)
    put("lora_dropout", float(m.lora_dropout))
    put("lora_target_modules", lambda: _lora_targets(m.lora_target_modules, path))


def _lora_targets(given: str | list[str] | None, model_dir: str) -> list[str]:
    """The recipe's lora_target_modules in every form TRL hands PEFT: a list of module names;
    `all-linear`; any other string, a regex PEFT full-matches against each module's whole
    name (ModelConfig turns a one-name list into that string); None, PEFT's default for the
    model's type, as TRL's get_peft_config leaves it to PEFT."""
    if isinstance(given, str):
        return ["all-linear"] if given == "all-linear" else _regex_targets(given, model_dir)
    if given:
        return list(given)
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    model_type = _model_config(model_dir).get("model_type")
    if model_type not in TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING:
        raise _refuse("lora_target_modules", None, f"PEFT has no default for {model_type!r}")
    return list(TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING[model_type])


def _dtype(given: str | None, model_dir: str) -> str:
    """ModelConfig's dtype as our model.dtype: `auto` (or None) is the checkpoint's own, as
    transformers reads it (float32 where the config names none)."""
    if given not in (None, "auto"):
        return given
    config = _model_config(model_dir)
    return str(config.get("dtype") or config.get("torch_dtype") or "float32")


def _model_config(model_dir: str) -> dict[str, Any]:
    import json

    return json.loads((Path(model_dir) / "config.json").read_text())


def _regex_targets(pattern: str, model_dir: str) -> list[str]:
    """The module names a regex target matches, as a list PEFT matches the same modules by:
    their last parts when the regex takes every module of those names, else whole names."""
    import re

    names = _linear_modules(model_dir)
    try:
        matched = [name for name in names if re.fullmatch(pattern, name)]
    except re.error as e:
        raise _refuse("lora_target_modules", pattern, f"not a regex PEFT can read ({e})") from None
    if not matched:
        raise _refuse(
            "lora_target_modules",
            pattern,
            "one name is a regex over whole module names in TRL and PEFT, and this one matches "
            "no linear layer of the model; list the names ([q_proj, v_proj]) or give a regex "
            "such as '.*\\.q_proj'",
        )
    last = {name.rsplit(".", 1)[-1] for name in matched}
    every = [name for name in names if name.rsplit(".", 1)[-1] in last]
    return sorted(last) if every == matched else matched


@cache
def _linear_modules(model_dir: str) -> list[str]:
    """The whole names of the model's linear layers, from its config alone (no weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]


def _task(recipe: Recipe, cfg: DictConfig) -> dict[str, Any]:
    from trainer.backends.trl.recipe_task import BUILT_IN_REWARDS, RecipeTask, reward_model_entries

    s = recipe.script
    if recipe.mixture.datasets:
        raise _refuse("datasets", "...", "dataset mixtures are not supported; use dataset_name")
    if s.dataset_streaming:
        raise _refuse("dataset_streaming", True, "a sweep reads the dataset whole")
    if not s.dataset_name:
        raise _refuse("dataset_name", None, "must be given")
    if isinstance(s.reward_funcs, str):  # `trl grpo` would read it letter by letter
        raise _refuse("reward_funcs", s.reward_funcs, f"must be a list: [{s.reward_funcs}]")
    if not s.reward_funcs and not s.reward_model_name_or_path:
        raise _refuse("reward_funcs", s.reward_funcs, "must name at least one reward")
    rewards = reward_model_entries(s.reward_model_name_or_path, recipe.grpo)  # first, as TRL's
    for name in s.reward_funcs or ():
        target = BUILT_IN_REWARDS.get(name, name)
        if "." not in target:
            raise _refuse(
                "reward_funcs",
                name,
                f"neither one of TRL's {sorted(BUILT_IN_REWARDS)} nor a dotted import path",
            )
        _check_imports(name, target)
        rewards.append({"_target_": target, "style": "trl", "name": target.rsplit(".", 1)[-1]})
    old = cfg.task
    return {
        "_target_": f"{RecipeTask.__module__}.{RecipeTask.__name__}",
        "dataset_name": str(Path(s.dataset_name).expanduser()),
        "dataset_config": s.dataset_config,
        "train_split": s.dataset_train_split,
        "test_split": s.dataset_test_split,
        "rewards": rewards,
        "reward_weights": None,  # the recipe's reward_weights: task.reward_weights (BACK)
        "reward_timeout": old.get("reward_timeout", 5),
        "chat_template": old.get("chat_template", "auto"),
        "system_prompt": old.get("system_prompt"),
    }


def _check_imports(name: str, target: str) -> None:
    """A dotted reward_funcs entry that does not import, refused naming it (as `trl grpo`,
    the working directory is on the path)."""
    import os
    import sys

    from hydra.utils import get_method

    from records.errors import first_line

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        get_method(target)
    except Exception as e:
        cause = e.__cause__ or e
        raise _refuse(
            "reward_funcs", name, f"cannot import it ({type(cause).__name__}: {first_line(cause)})"
        ) from None


def _plain(value: Any) -> Any:
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


# --- the recipe with tuned values, for `trl grpo --config` -------------------------------

# our LoRA keys under ModelConfig's names (use_peft follows lora_rank)
LORA_NAMES = {
    "lora_rank": "lora_r",
    "lora_alpha": "lora_alpha",
    "lora_dropout": "lora_dropout",
    "lora_target_modules": "lora_target_modules",
}
PICKS = ("backend", "backend.name", KEY)  # what picks the backend and the recipe


def tuned_recipe(cfg: DictConfig, overrides: list[str], notes: dict[str, Any]) -> str:
    """The recipe's YAML as written, with a trial's overrides filled in under TRL's names:
    `trl grpo --config` runs it. cfg: the trial's composed config (hydra node included);
    the notes become comment lines, with the overrides TRL has no field for."""
    import yaml

    resolved = with_recipe(cfg, overrides)
    recipe = read(cfg.backend.config)
    resolved.output_dir = str(recipe.grpo.output_dir)  # owned: the recipe's stays (no hydra run)
    fields, ours_only = trl_fields(resolved, explicit_keys(overrides))
    header = [f"# {k}: {v}" for k, v in notes.items()]
    header.append(f"# from {recipe.path} (sha256 {recipe.sha256}), tuned values filled in")
    if ours_only:
        header.append(f"# the sweep's own settings, no TRL field: {', '.join(ours_only)}")
    written = dict(recipe.written)
    if {"per_device_train_batch_size", "steps_per_generation"} & set(fields):
        written.pop("generation_batch_size", None)  # TRL refuses it beside steps_per_generation
    body = yaml.safe_dump({**written, **fields}, sort_keys=False)
    return "\n".join(header) + "\n" + body


def trl_fields(cfg: DictConfig, keys: set[str]) -> tuple[dict[str, Any], list[str]]:
    """(TRL's fields -> values, the keys with no TRL field) for the keys of a resolved cfg."""
    from records.tuned_file import NOT_TUNED_KEYS
    from trainer.backends.trl.mapping import grpo_kwargs

    kwargs = grpo_kwargs(cfg, _lr(cfg))
    fields: dict[str, Any] = {}
    ours_only = []
    for key in sorted(keys):
        if key in PICKS or key.split(".")[0] in NOT_TUNED_KEYS:  # not a training setting
            continue
        grpo_name = key.removeprefix("backend.grpo.")
        if grpo_name != key:  # a TRL name: the field itself (ours, when translated)
            row = BACK.get(grpo_name)
            fields[grpo_name] = kwargs[grpo_name] if row is None else _value(cfg, row.key)
            continue
        found = {
            row.field: kwargs[row.field]
            for row in TABLE
            if row.field not in OWNED and any(_covers(key, k) for k in row.ours.split(", "))
        }
        if any(_covers(key, k) for k in LORA_NAMES):
            found["use_peft"] = cfg.lora_rank > 0
            found |= {
                trl: _value(cfg, ours) for ours, trl in LORA_NAMES.items() if _covers(key, ours)
            }
        if _covers(key, "model.path"):
            found["model_name_or_path"] = cfg.model.path
        if "reward_weights" in found:
            found["reward_weights"] = _value(cfg, "task.reward_weights")
        fields.update(found)
        if not found:
            ours_only.append(f"{key}={_value(cfg, key)}")
    return {k: _plain(v) for k, v in fields.items()}, ours_only


def _covers(given: str, key: str) -> bool:
    """Whether setting `given` sets `key` (itself, or its group: loss=dapo sets loss.name)."""
    return key == given or key.startswith(given + ".")


def _value(cfg: DictConfig, key: str) -> Any:
    value = OmegaConf.select(cfg, key)
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _lr(cfg: DictConfig) -> float:
    """The run's lr as TRL gets it (lr=auto from the model's hidden size)."""
    from trainer.run.lr import resolve_lr

    return resolve_lr(cfg, _model_config(cfg.model.path)["hidden_size"])
