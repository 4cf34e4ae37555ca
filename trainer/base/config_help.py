"""The text of `--help`: the config groups and every key with its default and one line.

Hydra's `hydra/help` template (conf/config.yaml) calls the `config_help` resolver registered
here. A key's line is the comment beside its field (or the first sentence of the comment above
it) in the dataclass that declares it, or in the group's YAML file for a group without a schema
(task/): each fact stays where it is declared, read once at `--help`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import re
import textwrap
from enum import Enum
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.nodes import EnumNode

from records.sweep import BINDING_KEY

RESOLVER = "config_help"
SECTION = re.compile(r"#\s*---\s*(.*?)\s*---")  # `# --- batch shape ---` heads a section
FIELD = re.compile(r"^\s*(\w+)\s*:")  # `name: type = default` or `name: value` (YAML)
FIRST_SENTENCE = re.compile(r"(?<!e\.g\.)(?<!i\.e\.)(?<!\.\.\.)(?<=\.)\s+")
WIDTH = 100  # a note wraps under itself past this column
HIDDEN_GROUPS = ("schema", "hydra")  # the root schema is chosen by the app, never by a user
HIDDEN_KEYS = (BINDING_KEY,)  # filled in by the sweeper for each job


def register_resolver() -> None:
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, _resolve)


def _resolve(what: str, *, _root_: DictConfig) -> str:
    text = groups_text() if what == "groups" else settings_text(_root_)
    return text.replace("$", "$$")  # Hydra fills the template in with string.Template


def groups_text() -> str:
    """`group: option, ...` for each group a user picks, internal schemas left out."""
    from hydra.core.global_hydra import GlobalHydra

    loader = GlobalHydra.instance().config_loader()
    lines = []
    for group in sorted(loader.list_groups("")):
        if group in HIDDEN_GROUPS:
            continue
        options = [o for o in loader.get_group_options(group) if not o.endswith("_schema")]
        if options:
            lines.append(f"{group}: {', '.join(sorted(options))}")
    return "\n".join(lines)


def settings_text(root: DictConfig) -> str:
    """Every key of the app's config, then of `hydra.sweeper` when its schema documents it."""
    choices = root.hydra.runtime.choices
    blocks = []
    root_rows: list[tuple[str, str, str]] = []
    for key in root:
        if key == "hydra" or key in HIDDEN_KEYS:
            continue
        node = root._get_node(key)
        if isinstance(node, DictConfig) and key in choices:
            title = f"{key} ({key}={choices[key]})"
            notes = _notes_of(node, functools.partial(_group_file, root, key), choices[key])
            blocks.append((title, list(_rows(node, f"{key}.", notes))))
        else:
            root_rows.append(_row(root, key, key, _notes_of(root)))
    blocks += _sectioned(root_rows, "settings")
    sweeper = root.hydra._get_node("sweeper")
    sweeper_notes = _notes_of(sweeper)
    if any(note for _, note in sweeper_notes.values()):
        rows = list(_rows(sweeper, "hydra.sweeper.", sweeper_notes))
        blocks += _sectioned(rows, "sweeper", prefix="hydra.sweeper: ")
    return "\n\n".join(_block(title, rows) for title, rows in blocks)


def _rows(node: DictConfig, prefix: str, notes: dict[str, tuple[str, str]]):
    for key in node:
        if str(key).startswith("_"):
            continue  # _target_ and the like: how a node is built, not a setting
        child = node._get_node(key)
        if isinstance(child, DictConfig) and _dataclass_of(child) is not None:
            yield from _rows(child, f"{prefix}{key}.", _notes_of(child))
        else:
            yield _row(node, key, prefix + str(key), notes)


def _row(node: DictConfig, key: Any, name: str, notes) -> tuple[str, str, str]:
    section, note = notes.get(str(key), ("", ""))
    child = node._get_node(key)
    if isinstance(child, EnumNode):
        note = f"{note} ({', '.join(m.name for m in child.enum_type)})".lstrip()
    return section, f"{name}={_value(child)}", note


def _sectioned(rows: list[tuple[str, str, str]], default: str, prefix: str = ""):
    """Rows grouped under the `# --- section ---` headers of their schema, in order."""
    blocks: list[tuple[str, list]] = []
    for section, *row in rows:
        title = prefix + (section or default)
        if not blocks or blocks[-1][0] != title:
            blocks.append((title, []))
        blocks[-1][1].append((section, *row))
    return blocks


def _block(title: str, rows) -> str:
    width = min(max((len(r[1]) for r in rows), default=0), 40)
    lines = [f"{title}:"]
    for _, setting, note in rows:
        wrapped = textwrap.wrap(note, WIDTH - width - 4) or [""]
        lines.append(f"  {setting.ljust(width)}  {wrapped[0]}".rstrip())
        lines += [" " * (width + 4) + more for more in wrapped[1:]]
    return "\n".join(lines)


def _value(node: Any) -> str:
    if node._is_missing():
        return "???"
    if node._is_interpolation():
        return str(node._value())
    value = OmegaConf.to_container(node) if isinstance(node, DictConfig | ListConfig) else node
    value = value._value() if hasattr(value, "_value") else value
    if isinstance(value, Enum):
        return value.name
    if value is None or isinstance(value, bool | dict | list):
        import json

        return json.dumps(value).replace('"', "")
    return str(value)


def _dataclass_of(node: DictConfig) -> type | None:
    kind = node._metadata.object_type
    return kind if kind is not None and dataclasses.is_dataclass(kind) else None


def _notes_of(node: DictConfig, find=None, option: str = "") -> dict[str, tuple[str, str]]:
    """{key: (section, one line)} from the node's dataclass and its bases, or else from its
    group's YAML file (`find(option)`, the file's path) and the files it extends."""
    kind = _dataclass_of(node)
    if kind is not None:
        notes: dict[str, tuple[str, str]] = {}
        for base in reversed(kind.__mro__):
            if dataclasses.is_dataclass(base):
                notes.update(_source_notes(tuple(inspect.getsource(base).splitlines())))
        return notes
    path = find(option) if find is not None else None
    if path is None:
        return {}
    with open(path, encoding="utf-8") as f:
        text = f.read()
    notes = {}
    defaults = OmegaConf.create(text).get("defaults", [])
    for name in (d for d in defaults if isinstance(d, str) and d != "_self_"):
        notes.update(_notes_of(node, find, name))
    return notes | _source_notes(tuple(text.splitlines()))


@functools.cache
def _source_notes(lines: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """Each field's comment: the one beside it, else the first sentence of the block above."""
    notes, section, above = {}, "", []
    indent, in_docstring = None, False
    for line in lines:
        stripped = line.strip()
        if stripped.count('"""') % 2:
            in_docstring = not in_docstring
            continue
        if in_docstring:
            continue
        if stripped.startswith("#"):
            if header := SECTION.match(stripped):
                section, above = header.group(1), []
            else:
                above.append(stripped.lstrip("#").strip())
            continue
        match = FIELD.match(line)
        current = len(line) - len(line.lstrip())
        if match and (indent is None or current == indent) and not stripped.startswith("def "):
            indent = current
            beside = line.split("  # ", 1)[1].strip() if "  # " in line else ""
            block = FIRST_SENTENCE.split(" ".join(above), maxsplit=1)[0]
            notes[match.group(1)] = (section, beside or block)
        above = []
    return notes


def _group_file(root: DictConfig, group: str, option: str) -> str | None:
    """The YAML file that option of a group was read from, first on the search path."""
    for source in root.hydra.runtime.config_sources:  # file:// and the working directory's
        path = os.path.join(source.path, group, f"{option}.yaml")
        if os.path.isabs(path) and os.path.isfile(path):
            return path
    return None


def without_multirun(argv: list[str]) -> list[str]:
    """`argv` to show a config (`--cfg`, `--info`) with `-m` dropped, as Hydra takes one mode.

    Raises ValueError, in one line, when a swept value leaves no single config to show.
    """
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        args = get_args_parser().parse_args(argv)
    except SystemExit:
        return argv  # Hydra says what is wrong with the flags itself
    if not args.multirun or not (args.cfg or args.info):
        return argv
    flag = "--cfg" if args.cfg else "--info"
    for override in OverridesParser.create().parse_overrides(args.overrides):
        if override.is_sweep_override():
            first = next(iter(override.sweep_string_iterator()))
            raise ValueError(
                f"{flag} shows one config and {override.input_line} sweeps several: give one "
                f"value ({override.get_key_element()}={first}) to see that trial's config"
            )
    return [arg for arg in argv if arg not in ("-m", "--multirun")]
