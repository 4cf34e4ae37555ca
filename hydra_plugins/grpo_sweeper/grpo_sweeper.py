"""The Sweeper class Hydra instantiates, and its settings schema registered (the schema is the
sweeper's: sweeper/plan/settings_schema.py); the work is done by the `sweeper` package.

A sweep is planned and checked first (`sweeper.plan`: Hydra, Optuna and the config checks),
then run (`sweeper.sweep.loop.SweepRunner`, which loads MLflow, PEFT and the trainer). A bad
input thus fails before the heavy imports, and scanning the plugins stays fast for every Hydra
app in this environment.
"""

from __future__ import annotations

import sys
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from sweeper.plan.settings_schema import GRPOSweeperConf

ConfigStore.instance().store(
    group="hydra/sweeper", name="grpo_optuna", node=GRPOSweeperConf, provider="grpo_sweeper"
)


class GRPOSweeper(Sweeper):
    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        self.config: DictConfig | None = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.hydra_context, self.task_function, self.config = hydra_context, task_function, config

    def sweep(self, arguments: list[str]) -> Any:
        from sweeper import SweepError
        from sweeper.plan.sweep_plan import plan_sweep

        conf = GRPOSweeperConf(**self.settings)
        try:
            plan = plan_sweep(conf, self.config, self.hydra_context.config_loader, arguments)
            from sweeper.sweep.loop import (
                SweepRunner,  # MLflow and the trainer, once the plan holds
            )

            runner = SweepRunner(
                plan,
                conf,
                hydra_context=self.hydra_context,
                task_function=self.task_function,
                config=self.config,
            )
            return runner.sweep()
        except SweepError as e:
            sys.exit(f"error: {e}")
