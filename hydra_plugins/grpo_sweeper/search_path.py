"""Adds the working directory to Hydra's config search path, at the lowest priority.

`tuned/<study>.yaml` is written in the directory a sweep runs from, so `+tuned=<study>`
finds it from any app of this project (`python -m trainer`, `python -m sweeper`).
"""

from __future__ import annotations

import os

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class WorkingDirSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="grpo-sweeper-cwd", path=f"file://{os.getcwd()}")
