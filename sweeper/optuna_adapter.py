"""Every use of Optuna's and Hydra's non-public API, in one place.

The sweeper needs a few things neither library exposes: a study's storage and id (to claim
a queued trial atomically and to find stale ones), a trial's storage id (to open the live
trial from another process), and Hydra's quoting of an override value. An upgrade of either
library touches this file only.
"""

from __future__ import annotations

from typing import Any

import optuna
from hydra.core.override_parser.types import Override
from hydra.core.utils import JobReturn, JobStatus
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, Trial, TrialState


def storage_of(study: optuna.Study) -> BaseStorage:
    return study._storage


def database_of(study: optuna.Study) -> BaseStorage:
    """The RDB storage under the in-memory cache Optuna wraps it in (`_CachedStorage`, which
    forwards the public calls but has none of RDBStorage's own attributes)."""
    storage = storage_of(study)
    return getattr(storage, "_backend", storage)


def trial_id(trial: Trial | FrozenTrial) -> int:
    """The trial's id in its storage (what a job in another process opens it by)."""
    return trial._trial_id


def waiting_trials(study: optuna.Study) -> list[FrozenTrial]:
    return storage_of(study).get_all_trials(study._study_id, states=(TrialState.WAITING,))


def claim(study: optuna.Study, frozen: FrozenTrial) -> bool:
    """WAITING -> RUNNING; False when another worker moved it first. The heartbeat goes
    first: Optuna never finds a RUNNING trial without one stale, so a worker killed between
    the claim and its first beat would leave the point RUNNING forever."""
    storage = storage_of(study)
    if storage.get_heartbeat_interval() is not None:
        storage.record_heartbeat(trial_id(frozen))  # harmless on a trial that stays WAITING
    return storage.set_trial_state_values(trial_id(frozen), state=TrialState.RUNNING)


def stale_trial_ids(study: optuna.Study) -> list[int]:
    """RUNNING trials whose heartbeat stopped longer than the grace period ago."""
    storage = storage_of(study)
    if storage.get_heartbeat_interval() is None:
        return []
    return storage._get_stale_trial_ids(study._study_id)


def fresh(study: optuna.Study, trial_id_: int) -> FrozenTrial:
    """The trial as the storage holds it now (not the study's cache)."""
    return storage_of(study).get_trial(trial_id_)


def set_attr(study: optuna.Study, trial_id_: int, key: str, value: Any) -> None:
    storage_of(study).set_trial_user_attr(trial_id_, key, value)


def fail(study: optuna.Study, trial_id_: int) -> None:
    storage_of(study).set_trial_state_values(trial_id_, state=TrialState.FAIL)


def record_heartbeat(study: optuna.Study, trial_id_: int) -> None:
    storage_of(study).record_heartbeat(trial_id_)


def format_override_value(value: Any) -> str:
    """A value as Hydra's override grammar parses it back to the same thing."""
    return Override._get_value_element_as_str(value)


def job_error(ret: JobReturn) -> BaseException | None:
    """What a failed job raised (None when it returned). Hydra's public accessor re-raises
    it after printing "Error executing job" to stderr, noise for a trial we handle."""
    return ret._return_value if ret.status == JobStatus.FAILED else None


def failed_return(error: BaseException) -> JobReturn:
    """A JobReturn for a job the launcher could not run at all."""
    return JobReturn(status=JobStatus.FAILED, _return_value=error)
