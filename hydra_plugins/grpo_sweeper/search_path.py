"""Adds the working directory's config folders to Hydra's search path, for this project's apps.

`tuned/<study>.yaml` is written in the directory a sweep runs from, so `+tuned=<study>`
finds it from `python -m trainer` and `python -m sweeper` alike; a user's own config files
there (`task/mytask.yaml` -> `task=mytask`) join the installed ones the same way. Only the
folders named like the project's groups (and `tuned/`) are seen there: the outputs a sweep
leaves beside them (mlruns/, multirun/, outputs/) hold YAML files too, and would otherwise
become config groups in `--help` and in Hydra's group lookups. Other Hydra apps in the
environment are left alone: the plugin acts only when the primary config directory is this
project's.
"""

from __future__ import annotations

import os

from hydra._internal.core_plugins.file_config_source import FileConfigSource
from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.plugins.search_path_plugin import SearchPathPlugin

SCHEME = "grpo-cwd"
TUNED = "tuned"  # records/tuned_file.py writes there


class WorkingDirSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from trainer.base.config import config_dir  # deferred: Hydra scans plugins at every start

        ours = os.path.realpath(config_dir())
        primary = [e.path for e in search_path.get_path() if e.provider == "main"]
        if any(os.path.realpath(p.removeprefix("file://")) == ours for p in primary if p):
            search_path.append(provider="grpo-sweeper-cwd", path=f"{SCHEME}://{os.getcwd()}")


class WorkingDirConfigSource(FileConfigSource):
    """The working directory's files, its folders limited to the project's group names."""

    @staticmethod
    def scheme() -> str:
        return SCHEME

    def is_group(self, config_path: str) -> bool:
        return self._seen(config_path) and super().is_group(config_path)

    def is_config(self, config_path: str) -> bool:
        return self._seen(config_path) and super().is_config(config_path)

    def list(self, config_path: str, results_filter: ObjectType | None) -> list[str]:
        found = super().list(config_path, results_filter)
        return [name for name in found if self._seen(name)]

    def _seen(self, config_path: str) -> bool:
        """The root itself, a root file, or anything under a folder named like a group of ours."""
        from trainer.base.config import config_dir

        top = config_path.strip("/").split("/")[0]
        if not top or not os.path.isdir(os.path.join(self.path, top)):
            return True
        return top in _group_names(config_dir())


def _group_names(conf: str) -> set[str]:
    return {entry.name for entry in os.scandir(conf) if entry.is_dir()} | {TUNED}
