"""The sweep job's config: the training schema plus the binding to a live Optuna trial.

What binds a run to a trial belongs to the results layer, not the trainer (which never reads
it): the sweeper composes `sweep` with it for each job, and `python -m analysis best` rebuilds a
trial's config with it; conf/sweep.yaml selects it (`override schema: sweep_job`). Registering
it is cheap, so every entry point that composes `sweep` imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from records.sweep import BINDING_KEY
from trainer.base.config import TrainConfig, register_configs


@dataclass
class TrialBinding:
    """Filled in by the sweeper so a job in any process can reach its live Optuna trial.

    Empty for a single run (`python -m sweeper` without -m).
    """

    id: int | None = None  # Optuna trial id in the storage
    number: int | None = None  # the trial's number within its study
    replicate: int = 0  # which seed of the trial; the first reports to Optuna's pruner
    storage: str | None = None  # Optuna storage URL
    study: str | None = None  # study name
    parent_run_id: str | None = None  # MLflow run the job's run nests under
    db_retry_seconds: float | None = None  # hydra.sweeper.db_retry_seconds, resolved


@dataclass
class SweepJobConfig(TrainConfig):
    trial: TrialBinding = field(default_factory=TrialBinding)


def register_sweep_job_config() -> None:
    register_configs()
    ConfigStore.instance().store(
        group="schema", name="sweep_job", node=SweepJobConfig, package="_global_"
    )


def training_config(cfg: DictConfig) -> DictConfig:
    """The job's config without the binding: exactly what `python -m trainer` would train."""
    return OmegaConf.masked_copy(cfg, [k for k in cfg if k != BINDING_KEY])


register_sweep_job_config()
