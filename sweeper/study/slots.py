"""The sweep's plan, held in the study as queued (WAITING) trials: one slot per trial to run.

Why slots: several sweeper processes may share a study, and a worker that counts what is
left and then calls `study.ask()` races the others; `ask` creates a new trial whenever the
queue is empty, so the loser adds a trial the plan never had. Optuna's GridSampler has the
same race at the end of a grid (its docs: workers "will occasionally suggest the same
parameter configuration"). Here the plan is queued once, and a worker takes a slot by
moving it WAITING -> RUNNING, which the storage grants to exactly one process.

A grid slot carries its point as fixed params; a TPE (random, gp, cmaes) slot carries none
and the sampler fills it in when taken. An interrupted trial gives its slot back: a new
WAITING trial with the same params (`retry_of` names the original). Whoever changes the plan
(take, fill, fail-and-give-back) holds `optuna_storage.exclusive`, so no worker sees it half-changed.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, Trial

from records.optuna_storage import exclusive
from records.sweep import TrialAttr, is_interrupted
from sweeper import optuna_adapter as oa
from sweeper.plan.search_sampler import SearchSampler
from sweeper.plan.space import SearchSpace
from sweeper.results.display import Counts


def fill(study: optuna.Study, url: str, space: SearchSpace, search_sampler: SearchSampler) -> int:
    """Queue the slots the plan lacks; return how many. Run by the study's creator, and
    by a worker that joins it (a resume with a larger n_trials adds the difference). A point
    whose re-queue was lost with its worker is not queued afresh: the sweep gives it back with
    its checkpoint and runs (sweeper/sweep/tell.py give_back_lost)."""
    with exclusive(url):
        trials = study.get_trials(deepcopy=False)
        unqueued = never_queued_again(trials)  # the sweep queues these, with their checkpoints
        if search_sampler.is_grid:
            have = [point_of(t) for t in trials if not is_interrupted(t) or t in unqueued]
            missing = [p for p in grid_configurations(space) if p not in have]
        else:
            taken = Counts.of(study).slots + len(unqueued)
            missing = [{}] * max(0, search_sampler.planned - taken)
        for params in missing:
            study.enqueue_trial(params)
    return len(missing)


def never_queued_again(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """Interrupted trials whose point has no retry: the worker giving it back was killed
    between failing the trial and queuing its point. A point some other trial holds is
    left alone (a study from before retries were found this way queued it afresh)."""
    retried = {t.user_attrs.get(TrialAttr.RETRY_OF) for t in trials}
    unqueued = [t for t in trials if is_interrupted(t) and t.number not in retried]
    if not unqueued:  # the usual case, read on every turn of the sweep's loop
        return []
    held = [point_of(t) for t in trials if not is_interrupted(t)]
    return [t for t in unqueued if point_of(t) not in held]


def point_of(trial: FrozenTrial) -> dict:
    """A trial's point. A grid slot keeps it where enqueue_trial put it, for good: a slot
    being taken gets its params one write at a time, and a worker joining at that moment
    read the half-written point as a missing one and queued the point twice."""
    return trial.system_attrs.get("fixed_params") or trial.params


def grid_configurations(space: SearchSpace) -> list[dict]:
    names = list(space.params)
    values = [space.params[n].values or () for n in names]
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*values)]


def give_back(
    study: optuna.Study,
    trial: FrozenTrial,
    resume_dirs: dict[str, dict],
    carried: dict | None = None,
) -> None:
    """Queue an interrupted trial's point again; the next worker to take a slot runs it,
    resuming each seed from its folder's last checkpoint (when it saved one). carried: the
    records of seeds that completed ({replicate key: record}), kept rather than run again.
    The count of losses in a row goes with it (sweeper/study/recovery.py)."""
    attrs = {
        TrialAttr.RETRY_OF: trial.number,
        TrialAttr.RESUME_DIRS: resume_dirs,
        TrialAttr.LOST_IN_A_ROW: trial.user_attrs.get(TrialAttr.LOST_IN_A_ROW, 0),
        TrialAttr.CHECKPOINTS_SEEN: trial.user_attrs.get(TrialAttr.CHECKPOINTS_SEEN, []),
        **(carried or {}),
    }
    study.enqueue_trial(point_of(trial), user_attrs=attrs)  # whole, though it died mid-take


def take(study: optuna.Study, url: str, dists: dict[str, BaseDistribution]) -> Trial | None:
    """Take one queued slot (None when the queue is empty) and fill in its params."""
    with exclusive(url):
        for frozen in oa.waiting_trials(study):
            try:
                if oa.claim(study, frozen):
                    break
            except UpdateFinishedTrialError:
                continue  # another worker took and finished it a moment ago
        else:
            return None
    trial = Trial(study, oa.trial_id(frozen))
    for name, distribution in dists.items():
        suggest(trial, name, distribution)
    return trial


def suggest(trial: Trial, name: str, d: BaseDistribution) -> None:
    """The public suggest_* call for a distribution (a fixed param is returned as is)."""
    if isinstance(d, CategoricalDistribution):
        trial.suggest_categorical(name, d.choices)
    elif isinstance(d, IntDistribution):
        trial.suggest_int(name, d.low, d.high, step=d.step, log=d.log)
    elif isinstance(d, FloatDistribution):
        trial.suggest_float(name, d.low, d.high, step=d.step, log=d.log)
    else:
        raise TypeError(f"{name}: unsupported distribution {d!r}")
