"""Every key on the command line checked against the composed config before Hydra runs.

Hydra refuses an unknown key in a raw multi-line error naming an internal class, and accepts
`+key=value` on a typed node although nothing reads the key (the run then goes on at the
default). Here both are refused in one line naming the key and its closest known names (or
the option of its group that has it), before any study, MLflow store or output directory
exists. `python -m trainer` and `python -m sweeper` both ask here, each of its own config.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterator

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig
from omegaconf.errors import OmegaConfBaseException

# Hydra's own flags that pick another config: checking keys against ours would be wrong there.
OTHER_CONFIG = ("config_name", "config_path", "config_dir", "experimental_rerun")


def unknown_keys(argv: list[str], config_dir: str, config_name: str) -> str | None:
    """One line naming each unknown key of `argv` and its closest known names, or None.

    Anything Hydra reports better itself (a malformed override, a missing config group
    option, an unparsable flag) is left to Hydra: we answer None.
    """
    from hydra._internal.utils import get_args_parser

    try:
        args = get_args_parser().parse_args(argv)
    except SystemExit:
        return None
    if args.help or args.hydra_help or args.shell_completion or args.info:
        return None
    if any(getattr(args, name) for name in OTHER_CONFIG):
        return None
    try:
        overrides = OverridesParser.create().parse_overrides(args.overrides)
    except HydraException:
        return None
    problems = []
    try:
        for cfg, values in _composed(overrides, config_dir, config_name):
            problems = [(o, p) for o in values if (p := _problem(cfg, o))]
            if not problems:
                return None  # known under one choice of a swept config group
        said = [_other_option(o, config_dir, config_name) or p for o, p in problems]
    except (HydraException, OmegaConfBaseException):
        return None
    return "; ".join(said) or None


def _composed(
    overrides: list[Override], config_dir: str, config_name: str
) -> Iterator[tuple[DictConfig, list[Override]]]:
    """The config composed with the config-group choices only (once per choice of a swept
    group), and the value overrides to check against it."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        repository = GlobalHydra.instance().config_loader().repository  # type: ignore[attr-defined]
        groups = [o for o in overrides if repository.group_exists(o.key_or_group)]
        values = [o for o in overrides if o not in groups and not o.is_delete()]
        if not values:
            return
        fixed = [o.input_line for o in groups if not o.is_sweep_override()]
        swept = [o for o in groups if o.is_sweep_override()]
        choices = [
            [f"{o.get_key_element()}={choice}"]
            for o in swept
            for choice in o.sweep_string_iterator()
        ]
        for choice in choices or [[]]:
            cfg = compose(config_name, overrides=fixed + choice, return_hydra_config=True)
            yield cfg, values


def _other_option(override: Override, config_dir: str, config_name: str) -> str | None:
    """`task.path is a setting of task=jsonl: add task=jsonl` when the key belongs to another
    option of its config group than the one selected, else None."""
    key = override.key_or_group
    group = key.split(".")[0]
    if "." not in key or group == "hydra":
        return None
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        options = GlobalHydra.instance().config_loader().get_group_options(group)
        options = [o for o in options if not o.endswith("_schema")]
        owners = [f"{group}={o}" for o in options if _reads(config_name, f"{group}={o}", override)]
    if not owners:
        return None
    pick = f"add {owners[0]}" if len(owners) == 1 else "add one of them"
    return f"{override.input_line}: {key} is a setting of {' or '.join(owners)}: {pick}"


def _reads(config_name: str, choice: str, override: Override) -> bool:
    try:
        return _problem(compose(config_name, overrides=[choice]), override) is None
    except (HydraException, OmegaConfBaseException):
        return False  # an option that does not compose alone owns nothing


def _problem(cfg: DictConfig, override: Override) -> str | None:
    key = override.key_or_group
    if override.package is not None or "[" in key:
        return None  # a package or a list index: Hydra's and our checks judge those
    adding = override.is_add() or override.is_force_add()
    node = cfg
    parts = key.split(".")
    for i, part in enumerate(parts):
        if isinstance(node, ListConfig):
            return None
        if not isinstance(node, DictConfig) or node._is_none() or node._is_missing():
            return None  # an optional node not set: its type decides, not us
        if part in list(node):  # `part in node` is False for a MISSING value
            if i == len(parts) - 1:
                return None
            node = node._get_node(part)
            continue
        if adding and not _typed(node):
            return None  # an open mapping (e.g. backend.grpo): read as a whole downstream
        break
    name = override.input_line
    close = _closest(cfg, node, ".".join(parts[:i]), ".".join(parts[i:]))
    hint = f" (closest: {', '.join(close)})" if close else ""
    if adding:
        return f"{name}: nothing reads {key}{hint}"
    return f"{name}: no such setting{hint}"


def _typed(node: DictConfig) -> bool:
    return dataclasses.is_dataclass(node._metadata.object_type)


def _closest(cfg: DictConfig, parent: DictConfig, where: str, typed: str) -> list[str]:
    """The names beside the unknown one that look like it (`lr` for `lrr` or `lr_typo`),
    else the closest full paths anywhere (`model.path` for `model.pth`)."""
    prefix = f"{where}." if where else ""
    names = [str(k) for k in parent]
    close = difflib.get_close_matches(typed, names, n=3, cutoff=0.6)
    close += [n for n in names if n not in close and len(n) > 1 and typed.startswith(n)]
    if close:
        return [prefix + n for n in close[:3]]
    key = prefix + typed
    paths = [p for p in _paths(cfg, "") if key.startswith("hydra.") == p.startswith("hydra.")]
    return difflib.get_close_matches(key, paths, n=3, cutoff=0.6)


def _paths(node: DictConfig, prefix: str) -> Iterator[str]:
    for key in node:
        path = f"{prefix}{key}"
        yield path
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            yield from _paths(child, f"{path}.")
