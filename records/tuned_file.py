"""`tuned/<study>.yaml`: the best trial's settings, reusable as `+tuned=<study>`.

Plain values are read from the best trial's composed config (so `lr=2e-5` lands as a
number), config-group choices (`loss=ppo`) become `override /loss: ppo` entries of the
defaults list, and an earlier tuned config the sweep started from (`+tuned=old`) is
inlined rather than referenced, so the file stands on its own. The working directory is on
Hydra's search path (hydra_plugins/grpo_sweeper/search_path.py), which is how `+tuned=`
finds the file from `python -m trainer` and `python -m sweeper` alike.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf
from optuna.trial import FrozenTrial

from records.sweep import BINDING_KEY, TrialAttr
from records.tracking import BOOKKEEPING_KEYS

TUNED_DIR = "tuned"
SWEEP_ONLY_GROUPS = ("search", "schema")  # the search's presets, the job's own schema
NOT_TUNED_KEYS = (*BOOKKEEPING_KEYS, BINDING_KEY)  # where a run lives, not what it trains


def tuned_path(study_name: str, root: Path | None = None) -> Path:
    return (root or Path.cwd()) / TUNED_DIR / f"{study_name}.yaml"


def tuned_notes(
    study: str, storage: str, trial: FrozenTrial, objective: str, direction: str, verdict: str
) -> dict[str, Any]:
    """The comment lines of a tuned file: where its values come from, how sure the verdict
    is (analysis/verdict.py), how to reuse them."""
    return {
        "study": f"{study} (storage {storage})",
        "best trial": f"t{trial.number}, {objective} = {trial.value:.4g} ({direction})",
        "MLflow run": trial.user_attrs.get(TrialAttr.MLFLOW_RUN_ID, "-"),
        "reuse": f"python -m trainer +tuned={study}",
        "verdict": " ".join(verdict.splitlines()),
    }


def render_tuned(cfg: DictConfig, overrides: list[str], notes: Mapping[str, Any]) -> str:
    """The tuned YAML: the notes as comments, then the swept and fixed values."""
    defaults, values = tuned_settings(cfg, overrides)
    body: dict[str, Any] = {}
    if defaults:
        body["defaults"] = [*defaults, "_self_"]
    body.update(values)
    header = ["# @package _global_"] + [f"# {k}: {v}" for k, v in notes.items()]
    return "\n".join(header) + "\n" + OmegaConf.to_yaml(OmegaConf.create(body))


def write_tuned(
    path: Path, cfg: DictConfig, overrides: list[str], notes: Mapping[str, Any]
) -> None:
    """Write atomically: several workers of one study may write the same file."""
    text = render_tuned(cfg, overrides, notes)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def tuned_settings(cfg: DictConfig, overrides: list[str]) -> tuple[list[dict], dict]:
    """(defaults entries, nested values) for the overrides, read from the composed cfg.

    `cfg` is a trial's config as the launcher composes it, hydra node included (its
    runtime.choices say which keys are config groups).
    """
    choices = cfg.hydra.runtime.choices
    defaults: dict[str, dict] = {}
    values = OmegaConf.create({})
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.key_or_group
        if key == TUNED_DIR:
            old_defaults, old_keys = read_tuned(Path.cwd() / TUNED_DIR / f"{choices[key]}.yaml")
            defaults.update(old_defaults)
            for old_key in old_keys:
                OmegaConf.update(values, old_key, _value(cfg, old_key), merge=False)
        elif key in choices:
            if key not in SWEEP_ONLY_GROUPS:
                keyword = f"/{key}" if override.is_add() else f"override /{key}"
                defaults[key] = {keyword: choices[key]}
        elif key.split(".")[0] not in NOT_TUNED_KEYS:
            OmegaConf.update(values, key, _value(cfg, key), merge=False)
    return list(defaults.values()), OmegaConf.to_container(values)


def _value(cfg: DictConfig, key: str) -> Any:
    value = OmegaConf.select(cfg, key)
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value


def read_tuned(path: Path) -> tuple[dict[str, dict], list[str]]:
    """An earlier tuned file: its defaults entries by group, and its dotted value keys."""
    conf = OmegaConf.load(path)
    defaults = {}
    for entry in conf.pop("defaults", []):
        if isinstance(entry, DictConfig):
            keyword = next(iter(entry))
            defaults[keyword.split("/")[-1]] = OmegaConf.to_container(entry)
    keys: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, DictConfig):
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        else:
            keys.append(prefix[:-1])

    walk(conf, "")
    return defaults, keys
