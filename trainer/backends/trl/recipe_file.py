"""A `trl grpo --config` YAML read as `trl grpo --config` reads it: TRL's own parser
(`TrlParser`) over GRPOScriptArguments, GRPOConfig, ModelConfig and DatasetMixtureConfig,
TRL's defaults included (`read`, cached by the file's hash). What TRL or argparse refuses is
refused in one line naming the field (`refuse`); recipe.py turns the parsed recipe into our
config.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, NoReturn

from trainer.base.errors import ConfigError

KEY = "backend.config"


@dataclass(frozen=True)
class Recipe:
    path: str  # absolute
    sha256: str
    written: dict[str, Any]  # the YAML as written: the fields the user set
    script: Any  # GRPOScriptArguments
    grpo: Any  # GRPOConfig, TRL's defaults included
    model: Any  # ModelConfig
    mixture: Any  # DatasetMixtureConfig


def refuse(field: str, value: Any, rule: str) -> ConfigError:
    return ConfigError(f"{field}={value!r}: {rule} ({KEY})")


def fingerprint(path: str) -> tuple[str, str]:
    """(absolute path, sha256 of its bytes) of a recipe file."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"{KEY}={path!r}: no such file")
    return str(file.resolve()), hashlib.sha256(file.read_bytes()).hexdigest()


def read(path: str) -> Recipe:
    return _parse(*fingerprint(path))


@cache
def _parse(path: str, sha256: str) -> Recipe:
    import yaml

    written = yaml.safe_load(Path(path).read_text())
    if not isinstance(written, dict):
        raise ConfigError(f"{KEY}={path!r}: must be a YAML mapping, as `trl grpo --config` reads")
    if "env" in written:
        raise refuse("env", written["env"], "not set by a sweep; export the variables instead")
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
                raise refuse(field, written[field], f"TRL refuses it: {message}") from None
            raise ConfigError(f"{KEY}={path!r}: TRL refuses it: {message}") from None
    if unknown:
        field = unknown[0].lstrip("-")
        raise refuse(field, written.get(field), "not an option of `trl grpo`")
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
            raise refuse(field, written[field], f"TRL refuses it: {message.split(': ', 1)[-1]}")
        raise ConfigError(f"{KEY}: TRL refuses it: {message}")

    return error
