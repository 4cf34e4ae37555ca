"""Create a sweep's study and MLflow parent run, or join them (a resume, another worker).

Exactly one of several racing workers creates the study (`create_study` without
`load_if_exists` fails for the others); the creator records the study's settings, queues
its plan and names the parent run last, and the others wait for that name before joining.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.exceptions import DuplicatedStudyError
from optuna.storages import RDBStorage

from records.sweep import StudyAttr
from sweeper import SweepError
from sweeper.plan.search_sampler import SearchSampler
from sweeper.plan.settings import SweepSettings
from sweeper.plan.space import SearchSpace
from sweeper.results import runs
from sweeper.study import slots
from sweeper.study.heartbeat import wait_for

JOIN_TIMEOUT_S = 30  # how long a joining worker waits for the creator to finish setting up


@dataclass
class StudySpec:
    """Everything a study is created from."""

    name: str
    space: SearchSpace
    search_sampler: SearchSampler
    settings: SweepSettings
    experiment: str  # MLflow experiment


def open_study(storage: RDBStorage, spec: StudySpec) -> tuple[optuna.Study, str]:
    """The study and its parent run id; queue whatever slots the plan lacks."""
    if spec.name in optuna.get_all_study_names(storage):
        study, created = _create_or_join(storage, spec)
    else:
        parent = runs.start_parent_run(
            spec.experiment, spec.name, run_params(spec), spec.settings.objective
        )
        study, created = _create_or_join(storage, spec)
        if created:
            # Named, so optuna-dashboard and Optuna's plots say e.g. eval/reward/mean, not
            # "Objective 0".
            with warnings.catch_warnings():  # experimental in Optuna 5, stable in use
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names([spec.settings.objective])
            slots.fill(study, spec.settings.storage, spec.space, spec.search_sampler)
            for key, value in study_attrs(spec, parent).items():
                study.set_user_attr(key, value)  # the parent run id last
            return study, parent
        runs.discard_run(parent)  # another worker created the study a moment earlier
    parent_key = StudyAttr.MLFLOW_PARENT_RUN_ID
    if not wait_for(lambda: parent_key in study.user_attrs, 0.5, JOIN_TIMEOUT_S):
        raise SweepError(f"study {spec.name!r} has no MLflow parent run; use a new study_name")
    parent = study.user_attrs[parent_key]
    runs.reopen_run(parent)
    # e.g. a resume with a larger n_trials, or a point whose re-queue died with its worker
    slots.fill(study, spec.settings.storage, spec.space, spec.search_sampler)
    return study, parent


def _create_or_join(storage: RDBStorage, spec: StudySpec) -> tuple[optuna.Study, bool]:
    direction = spec.settings.direction
    try:
        study = optuna.create_study(
            storage=storage,
            study_name=spec.name,
            sampler=spec.search_sampler.optuna_sampler,
            direction=direction,
        )
        return study, True
    except DuplicatedStudyError:
        study = optuna.load_study(
            study_name=spec.name, storage=storage, sampler=spec.search_sampler.optuna_sampler
        )
    existing = study.direction.name.lower()
    if existing != direction:
        raise SweepError(
            f"hydra.sweeper.direction={direction}: study {spec.name!r} exists with "
            f"direction={existing}; pick another study_name"
        )
    return study, False


def study_attrs(spec: StudySpec, parent_run_id: str) -> dict[str, Any]:
    """The study's user attrs (records/sweep.py); jobs read their rules here."""
    s = spec.settings
    return {
        StudyAttr.OBJECTIVE: s.objective,
        StudyAttr.DIRECTION: s.direction,
        StudyAttr.HEALTH_RULES: [rule.as_dict() for rule in s.health_rules],
        StudyAttr.KL_THRESHOLD: s.kl_threshold,
        StudyAttr.PRUNER: s.pruner,
        StudyAttr.PRUNER_WARMUP_STEPS: s.pruner_warmup_steps,
        StudyAttr.FORECAST_LEVEL: s.forecast_level,
        StudyAttr.SAMPLER: spec.search_sampler.name,
        StudyAttr.SEEDS: s.seeds,
        **({StudyAttr.MAX_SEEDS: s.max_seeds} if s.race else {}),
        **({StudyAttr.MIN_DIFFERENCE: s.min_difference} if s.min_difference is not None else {}),
        StudyAttr.SEARCH_SPACE: spec.space.specs,
        StudyAttr.LOG_PARAMS: spec.space.log_params,
        StudyAttr.FIXED_OVERRIDES: spec.space.fixed,
        StudyAttr.MLFLOW_TRACKING_URI: runs.tracking_uri(),
        StudyAttr.MLFLOW_EXPERIMENT: spec.experiment,
        StudyAttr.MLFLOW_PARENT_RUN_ID: parent_run_id,  # last: joining workers wait for it
    }


def run_params(spec: StudySpec) -> dict[str, Any]:
    """The parent run's params: search space, sampler, pruning, objective, seeds."""
    s = spec.settings
    params: dict[str, Any] = {f"search_space.{k}": v for k, v in spec.space.specs.items()}
    params.update(
        sampler=spec.search_sampler.name,
        pruner=s.pruner,
        objective=s.objective,
        direction=s.direction,
        planned_trials=spec.search_sampler.planned,
        seeds=f"auto (max {s.max_seeds})" if s.race else s.seeds,
        health_rules=", ".join(rule.name for rule in s.health_rules) or "none",
        kl_threshold=s.kl_threshold,
        fixed_overrides=" ".join(spec.space.fixed),
    )
    return params
