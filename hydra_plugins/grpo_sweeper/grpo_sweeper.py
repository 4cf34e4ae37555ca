"""The Sweeper class Hydra instantiates; the work is done by `sweeper.sweep.SweepRunner`.

The import of the implementation (Optuna, MLflow) is deferred to `setup`, so scanning the
plugins stays fast for every Hydra app in this environment.
"""

from __future__ import annotations

from typing import Any

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from hydra_plugins.grpo_sweeper.config import GRPOSweeperConf


class GRPOSweeper(Sweeper):
    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.runner: Any = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        from sweeper.sweep import SweepRunner

        self.runner = SweepRunner(
            GRPOSweeperConf(**self.settings),
            hydra_context=hydra_context,
            task_function=task_function,
            config=config,
        )

    def sweep(self, arguments: list[str]) -> Any:
        return self.runner.sweep(arguments)
