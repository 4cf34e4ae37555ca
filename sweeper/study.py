"""Create a sweep's study and MLflow parent run, or join them (a resume, another worker).

Exactly one of several racing workers creates the study (`create_study` without
`load_if_exists` fails for the others); the creator records the study's settings, queues
its plan and names the parent run last, and the others wait for that name before joining.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import optuna
from optuna.exceptions import DuplicatedStudyError
from optuna.storages import RDBStorage

from hydra_plugins.grpo_sweeper.config import GRPOSweeperConf
from sweeper import records, slots
from sweeper.errors import SweepError
from sweeper.pruning import KLPruneRule
from sweeper.samplers import SamplerChoice
from sweeper.space import SearchSpace
from sweeper.storage import wait_for

JOIN_TIMEOUT_S = 30  # how long a joining worker waits for the creator to finish setting up


@dataclass
class StudySpec:
    """Everything a study is created from."""

    name: str
    space: SearchSpace
    plan: SamplerChoice
    rule: KLPruneRule
    settings: GRPOSweeperConf
    experiment: str  # MLflow experiment


def open_study(storage: RDBStorage, spec: StudySpec) -> tuple[optuna.Study, str]:
    """The study and its parent run id; queue whatever slots the plan lacks."""
    if spec.name in optuna.get_all_study_names(storage):
        study, created = _create_or_join(storage, spec)
    else:
        parent = records.start_parent_run(spec.experiment, spec.name, run_params(spec))
        study, created = _create_or_join(storage, spec)
        if created:
            slots.fill(study, spec.space, spec.plan)
            for key, value in study_attrs(spec, parent).items():
                study.set_user_attr(key, value)  # mlflow_parent_run_id last
            return study, parent
        records.delete_run(parent)  # another worker created the study a moment earlier
    if not wait_for(lambda: "mlflow_parent_run_id" in study.user_attrs, 0.5, JOIN_TIMEOUT_S):
        raise SweepError(f"study {spec.name!r} has no MLflow parent run; use a new study_name")
    parent = study.user_attrs["mlflow_parent_run_id"]
    records.reopen_run(parent)
    slots.fill(study, spec.space, spec.plan)  # e.g. a resume with a larger n_trials
    return study, parent


def _create_or_join(storage: RDBStorage, spec: StudySpec) -> tuple[optuna.Study, bool]:
    direction = spec.settings.direction
    try:
        study = optuna.create_study(
            storage=storage, study_name=spec.name, sampler=spec.plan.sampler, direction=direction
        )
        return study, True
    except DuplicatedStudyError:
        study = optuna.load_study(study_name=spec.name, storage=storage, sampler=spec.plan.sampler)
    existing = study.direction.name.lower()
    if existing != direction:
        raise SweepError(
            f"hydra.sweeper.direction={direction}: study {spec.name!r} exists with "
            f"direction={existing}; pick another study_name"
        )
    return study, False


def study_attrs(spec: StudySpec, parent_run_id: str) -> dict[str, Any]:
    """The study's user attrs (docs/records.md); jobs read their pruning rules here."""
    s, rule = spec.settings, spec.rule
    return {
        "objective": s.objective,
        "direction": s.direction,
        "kl_metric": rule.metric,
        "kl_threshold": rule.threshold,
        "kl_patience": rule.patience,
        "kl_warmup_steps": rule.warmup_steps,
        "pruner": s.pruner,
        "pruner_warmup_steps": s.pruner_warmup_steps,
        "sampler": spec.plan.name,
        "search_space": spec.space.specs,
        "log_params": spec.space.log_params,
        "fixed_overrides": spec.space.fixed,
        "mlflow_tracking_uri": records.tracking_uri(),
        "mlflow_experiment": spec.experiment,
        "mlflow_parent_run_id": parent_run_id,  # last: joining workers wait for it
    }


def run_params(spec: StudySpec) -> dict[str, Any]:
    """The parent run's params: search space, sampler, pruner, objective."""
    params: dict[str, Any] = {f"search_space.{k}": v for k, v in spec.space.specs.items()}
    params.update(
        sampler=spec.plan.name,
        pruner=spec.settings.pruner,
        objective=spec.settings.objective,
        direction=spec.settings.direction,
        planned_trials=spec.plan.planned,
        kl_metric=spec.rule.metric,
        kl_threshold=spec.rule.threshold,
        fixed_overrides=" ".join(spec.space.fixed),
    )
    return params
