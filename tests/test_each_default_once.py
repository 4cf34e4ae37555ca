"""Each default once: a YAML file in conf/ sets only what differs from its schema's default,
so that changing a default is one edit in one place.

The schemas are the dataclasses of trainer/base/config.py (the root TrainConfig and the
groups' `<group>_schema`) and the sweeper's settings (sweeper/plan/settings_schema.py,
under `hydra.sweeper`). A group option's `name` names the option: it is its file's stem.

A task has no schema Hydra could merge a `task.<key>=` override into (it is built by
`_target_`), so a task's YAML lists every setting, each at its class's default (and the prompt
and reward-timeout keys at theirs): the value is decided by the class, and this test keeps the
YAML from drifting from it (as `eval_size` once did).
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from sweeper.plan.settings_schema import GRPOSweeperConf
from trainer.base.config import LOSS_NAMES, TrainConfig, config_dir, register_configs
from trainer.env.prompts import PROMPT_DEFAULTS
from trainer.env.rewards import DEFAULT_TIMEOUT
from trainer.env.tasks import REWARD_TIMEOUT

CONF = Path(config_dir())
GLOBAL = "# @package _global_"


def plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else node


def root_schema() -> dict[str, Any]:
    root = plain(OmegaConf.structured(TrainConfig))
    root["hydra"] = {"sweeper": plain(OmegaConf.structured(GRPOSweeperConf))}
    return root


def group_schema(group: str, name: str) -> dict[str, Any]:
    register_configs()
    return plain(ConfigStore.instance().load(f"{group}/{name}.yaml").node)


def same(a: Any, b: Any) -> bool:
    """Equal as values: a tuple default equals the YAML's list, 5 equals 5.0."""
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return list(a) == list(b)
    return type(a) is type(b) and a == b or (_number(a) and _number(b) and a == b)


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def repeated(given: dict[str, Any], schema: dict[str, Any], where: str) -> list[str]:
    """`where.key=value` for each value that equals the schema's default, nested keys walked."""
    found = []
    for key, value in given.items():
        if key == "defaults" or key not in schema:
            continue
        default = schema[key]
        if isinstance(value, dict) and isinstance(default, dict):
            found += repeated(value, default, f"{where}{key}.")
        elif same(value, default):
            found.append(f"{where}{key}={value!r}")
    return found


def group_files() -> list[Path]:
    return sorted(p for p in CONF.glob("*/*.yaml") if p.parent.name not in ("hydra", "task"))


@pytest.mark.parametrize("path", group_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_group_option_sets_only_what_differs_from_its_schema(path):
    text = path.read_text()
    given = yaml.safe_load(text) or {}
    group = path.parent.name
    if text.startswith(GLOBAL):  # a preset that sets keys anywhere: against the root schema
        found = repeated(given, root_schema(), "")
    else:
        schemas = [d for d in given.get("defaults", []) if d == f"{group}_schema"]
        assert schemas, f"{path}: extends no {group}_schema"
        if "name" in group_schema(group, schemas[0]):
            # a loss preset under another name sets a registered loss's settings
            # (trl_default: TRL's dapo); every other option is named by its file
            alias = group == "loss" and path.stem not in LOSS_NAMES
            named = given.get("name") in LOSS_NAMES if alias else given.get("name") == path.stem
            assert named, f"{path}: name must be {path.stem!r}"
        given = {k: v for k, v in given.items() if k != "name"}
        found = repeated(given, group_schema(group, schemas[0]), f"{group}.")
    assert not found, f"{path} repeats the schema's defaults: {found}; leave them out"


@pytest.mark.parametrize("name", ["config.yaml", "sweep.yaml"])
def test_the_root_configs_repeat_no_default(name):
    given = yaml.safe_load((CONF / name).read_text()) or {}
    found = repeated(given, root_schema(), "")
    assert not found, f"conf/{name} repeats the schema's defaults: {found}; leave them out"


def task_defaults(target: str) -> dict[str, Any]:
    module, _, name = target.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    params = inspect.signature(cls).parameters.values()
    own = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    return {**own, REWARD_TIMEOUT: DEFAULT_TIMEOUT, **PROMPT_DEFAULTS}


@pytest.mark.parametrize("path", sorted(CONF.glob("task/*.yaml")), ids=lambda p: p.name)
def test_a_task_yaml_states_its_class_defaults(path):
    given = yaml.safe_load(path.read_text())
    if "_target_" not in given:  # extends another task's YAML (checked itself): its keys exist
        (base,) = [d for d in given["defaults"] if d != "_self_"]
        target = yaml.safe_load((path.parent / f"{base}.yaml").read_text())["_target_"]
        unknown = set(given) - {"defaults"} - set(task_defaults(target))
        assert not unknown, f"{path} sets {sorted(unknown)}, which {target} does not take"
        return
    defaults = task_defaults(given["_target_"])
    drifted = [
        f"task.{key}={value!r} (the class: {defaults[key]!r})"
        for key, value in given.items()
        if key in defaults and not same(value, defaults[key])
    ]
    assert not drifted, f"{path} disagrees with its class: {drifted}"
    missing = sorted(set(defaults) - set(given))
    assert not missing, f"{path} lacks {missing}: a `task.<key>=` override needs the key there"


def test_the_check_sees_a_repeated_default():
    assert repeated({"clip_high": 1.2, "clip_low": 0.7}, group_schema("loss", "loss_schema"), "")
    assert repeated({"hydra": {"sweeper": {"n_trials": 20}}}, root_schema(), "")
    assert not repeated({"lr": 1e-3}, root_schema(), "")
