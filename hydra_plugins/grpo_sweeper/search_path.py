"""Adds the working directory to Hydra's config search path, for this project's apps only.

`tuned/<study>.yaml` is written in the directory a sweep runs from, so `+tuned=<study>`
finds it from `python -m trainer` and `python -m sweeper` alike; a user's own config files
there (`task/mytask.yaml` -> `task=mytask`) join the installed ones the same way. Other Hydra
apps in the environment are left alone: the plugin acts only when the primary config
directory is this project's.
"""

from __future__ import annotations

import os

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class WorkingDirSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from trainer.base.config import config_dir  # deferred: Hydra scans plugins at every start

        ours = os.path.realpath(config_dir())
        primary = [e.path for e in search_path.get_path() if e.provider == "main"]
        if any(os.path.realpath(p.removeprefix("file://")) == ours for p in primary if p):
            search_path.append(provider="grpo-sweeper-cwd", path=f"file://{os.getcwd()}")
