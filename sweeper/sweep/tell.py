"""What the study and MLflow are told when a configuration leaves this worker: its outcome
(from what its seeds recorded), or, when it was interrupted or lost, its point queued again.

A configuration's objective is the mean over its seeds, which is what TPE learns from
(`combine`, pure). A seed a health rule stopped broke: it counts at the objective's floor
(judge/configs.py) when the objective's range is known, so the mean counts it as a run that
came to nothing; a configuration every seed of which broke ends pruned. A seed stopped
otherwise (the forecast; a broken seed with no floor) prunes the configuration, and one
failed fails it.

The loop (sweeper/sweep/loop.py) decides when; these say what is recorded.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import mean
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from judge.configs import at_floor, break_floor, broke_note
from judge.forecast import is_unsafe
from records.database import calm_for
from records.metrics import is_finite_number
from records.optuna_storage import exclusive
from records.sweep import (
    BREACH_CONSTRAINT,
    Replicate,
    State,
    Tag,
    TrialAttr,
    is_interrupted,
    replicate_key,
    replicates,
)
from sweeper import optuna_adapter as oa
from sweeper.plan.settings import SweepSettings
from sweeper.results import runs
from sweeper.results.display import say
from sweeper.study import recovery, slots
from sweeper.sweep.flights import InFlight
from trainer.base.errors import fail_reason

STALE_REASON = "its sweeper stopped (killed or lost) while it ran"


@dataclass(frozen=True)
class ConfigOutcome:
    state: str  # State.*
    value: float | None  # mean objective over the seeds (COMPLETE only)
    reason: str  # why it was pruned or failed ('' otherwise)
    breach: dict[str, Any] | None  # the health rule that pruned it
    steps_run: int  # training steps, all seeds together
    baseline: float | None  # mean eval reward at step 0


def combine(
    replicates: Sequence[Replicate], expected: int, floor: float | None = None
) -> ConfigOutcome:
    """The configuration's outcome from the seeds that ran (missing seeds never started).
    floor: what a seed that broke counts at (judge/configs.py break_floor; None: not counted)."""
    steps = sum(r.steps_run for r in replicates)
    baselines = [r.baseline for r in replicates if is_finite_number(r.baseline)]
    baseline = mean(baselines) if baselines else None
    counted = [r for r in replicates if at_floor(r, floor)]
    pruned = [r for r in replicates if r.state == State.PRUNED]
    failed = [r for r in replicates if r.state == State.FAIL]
    done = [r for r in replicates if r.state == State.COMPLETE and is_finite_number(r.value)]
    if pruned and (len(counted) < len(pruned) or not done):  # uncounted, or every seed broke
        first = min(pruned, key=lambda r: r.seed)
        reason = first.reason if expected == 1 else f"seed {first.seed}: {first.reason}"
        return ConfigOutcome(State.PRUNED, None, reason, first.breach, steps, baseline)
    if failed or len(done) + len(counted) < expected:
        first = min(failed, key=lambda r: r.seed) if failed else None
        if first is None:
            reason = f"{expected - len(done)} of {expected} seeds ended without an objective"
        elif expected == 1:
            reason = first.reason
        else:
            reason = f"{len(failed)} of {expected} seeds failed; seed {first.seed}: {first.reason}"
        return ConfigOutcome(State.FAIL, None, reason, None, steps, baseline)
    value = mean([r.value for r in done] + [floor] * len(counted))
    if counted:
        first = min(counted, key=lambda r: r.seed)
        reason = f"{broke_note(len(counted), expected, floor)}; seed {first.seed}: {first.reason}"
        return ConfigOutcome(State.COMPLETE, value, reason, first.breach, steps, baseline)
    return ConfigOutcome(State.COMPLETE, value, "", None, steps, baseline)


def floor_of(trials: Sequence[FrozenTrial], settings: SweepSettings) -> float | None:
    """What a seed that broke counts at in this study (judge/configs.py break_floor)."""
    return break_floor(settings.objective, settings.maximize, trials)


def tell_if_still_ours(
    study: optuna.Study, flight: InFlight, race: str, settings: SweepSettings, name: str
) -> None:
    """Tell the study, unless another worker found the trial stale meanwhile (it missed
    this worker's heartbeats) and queued its point again: that run counts, this is dropped."""
    try:
        if oa.fresh(study, oa.trial_id(flight.trial)).state == TrialState.RUNNING:
            tell_outcome(study, flight, race, settings, name)
            return
    except UpdateFinishedTrialError:  # taken over between the look and the tell
        pass
    say(
        f"[sweep {name}] t{flight.trial.number} was taken over by another worker "
        "(its heartbeats were missed); this worker's result of it is dropped"
    )


def tell_outcome(
    study: optuna.Study, flight: InFlight, race: str, settings: SweepSettings, name: str
) -> None:
    """The configuration's outcome, from what its seeds recorded, into the study."""
    trial = flight.trial
    if race:
        trial.set_user_attr(TrialAttr.RACE, race)  # its headline ends the trial's end line
    recorded = {r.seed: r for r in replicates(oa.fresh(study, oa.trial_id(trial)))}
    # A seed carried over from an interrupted run has no job here (None): it completed.
    errors = {seed: ret and oa.job_error(ret) for seed, ret in flight.ended.items()}
    lost = recovery.lost_reason(errors, recorded)
    if lost:  # the infrastructure, not the configuration: run it again
        with exclusive(settings.storage):
            if recovery.lose(study, oa.trial_id(trial), lost, settings.max_lost_in_a_row):
                give_back(study, oa.fresh(study, oa.trial_id(trial)), name)
        return
    for seed, ret in flight.ended.items():
        mine = recorded.get(seed)
        if mine is None or mine.state == State.RUNNING:  # its process died before recording
            error = (ret and oa.job_error(ret)) or RuntimeError("the job ended without a record")
            recorded[seed] = _died(seed, mine, fail_reason(error))
            runs.close_trial_run(recorded[seed].run_id, State.FAIL, recorded[seed].reason)
    floor = floor_of(study.get_trials(deepcopy=False), settings)
    out = combine([recorded[s] for s in flight.ended], len(flight.seeds), floor)
    trial.set_user_attr(TrialAttr.STEPS_RUN, out.steps_run)
    if out.baseline is not None:
        trial.set_user_attr(TrialAttr.BASELINE, out.baseline)
    if out.breach is not None:  # pruned, or completed with seeds that broke
        trial.set_user_attr(TrialAttr.PRUNE_REASON, out.breach)
        if is_unsafe(out.breach):  # a forecast's stop is no breach
            trial.set_constraint(BREACH_CONSTRAINT, 1.0)  # see BREACH_CONSTRAINT
    if out.state == State.COMPLETE:
        study.tell(trial, values=out.value)
    elif out.state == State.PRUNED:
        study.tell(trial, state=TrialState.PRUNED)
    else:
        trial.set_user_attr(TrialAttr.FAIL_REASON, out.reason)
        study.tell(trial, state=TrialState.FAIL)
    if flight.config_run_id:
        if race:
            runs.set_run_tags(flight.config_run_id, {Tag.RACE: race})
        runs.close_config_run(flight.config_run_id, out, list(recorded.values()))


def give_back_lost(study: optuna.Study, settings: SweepSettings, name: str) -> None:
    """Trials lost with their workers go back to the plan: with fail_stale_trials=true the
    RUNNING ones whose sweeper stopped (any worker may find them), and any interrupted trial
    whose point was never queued again (the worker giving it back was killed half-way)."""
    grace = settings.grace_period or 2 * settings.heartbeat_interval
    # Heartbeats are stamped with the database's clock: right after an outage every running
    # trial looks stale. Its grace counts from the store's return, not across the outage.
    stale = settings.fail_stale_trials and bool(oa.stale_trial_ids(study)) and calm_for() >= grace
    if not stale and not cut_short(study, grace):
        return
    with exclusive(settings.storage):  # a worker filling the plan sees each point queued again
        for trial in cut_short(study, grace):
            give_back(study, trial, name)
        if stale:
            lost = recovery.fail_stale_trials(study, STALE_REASON, settings.max_lost_in_a_row)
            for trial in lost:
                give_back(study, trial, name)


_UNQUEUED_SINCE: dict[tuple[str, int], float] = {}  # (study, trial) -> first seen, this process


def cut_short(study: optuna.Study, grace: float) -> list[FrozenTrial]:
    """Interrupted trials whose point this process has seen never queued again for a whole
    grace: the worker giving one back was killed half-way. The wait is for a worker still
    giving it back: a server restart drops the plan's lock (a session lock), so the lock
    alone cannot say that nobody is. Counted on this process's clock, not the hosts'."""
    now = time.monotonic()
    unqueued = slots.never_queued_again(study.get_trials(deepcopy=False))
    keys = {(study.study_name, t.number) for t in unqueued}
    for gone in set(_UNQUEUED_SINCE) - keys:
        del _UNQUEUED_SINCE[gone]
    return [
        t
        for t in unqueued
        if now - _UNQUEUED_SINCE.setdefault((study.study_name, t.number), now) >= grace
    ]


def give_back_interrupted(
    study: optuna.Study,
    flights: Iterable[InFlight],
    reason: str,
    settings: SweepSettings,
    name: str,
) -> None:
    """Ctrl-C or SIGTERM: the configurations in flight are interrupted, their points queued
    again; one that had ended meanwhile is left as it is."""
    with exclusive(settings.storage):  # a worker filling the plan sees each point queued again
        for flight in flights:
            trial_id = oa.trial_id(flight.trial)
            if recovery.interrupt(study, trial_id, reason):
                give_back(study, oa.fresh(study, trial_id), name, killed=True)


def give_back(study: optuna.Study, trial: FrozenTrial, name: str, killed: bool = False) -> None:
    """An interrupted trial: close its runs and queue its point again (to resume); one
    lost too often in a row (recovery.lose failed it): close its runs only."""
    reason = trial.user_attrs.get(TrialAttr.FAIL_REASON, STALE_REASON)
    # A seed stopped before it recorded itself keeps the folder and run it was to resume.
    resume_dirs, carried = dict(trial.user_attrs.get(TrialAttr.RESUME_DIRS, {})), {}
    for rep in replicates(trial):
        resume_dirs.pop(str(rep.seed), None)
        if rep.state == State.COMPLETE:  # a seed that ended is kept, not run again
            carried[replicate_key(rep.seed)] = rep.as_attr()
            continue
        runs.close_trial_run(rep.run_id, State.FAIL, reason, killed=killed)
        if rep.output_dir:
            resume_dirs[str(rep.seed)] = {"output_dir": rep.output_dir, "run_id": rep.run_id}
    for run_id in {
        trial.user_attrs.get(TrialAttr.MLFLOW_RUN_ID),
        *(d.get("run_id") for d in resume_dirs.values()),
        *runs.running_trial_runs(study.study_name, trial.number),  # created, not yet recorded
    }:
        runs.close_trial_run(run_id, State.FAIL, reason, killed)
    if not is_interrupted(trial):
        say(f"[sweep {name}] t{trial.number} failed: {reason}")
        return
    slots.give_back(study, trial, resume_dirs, carried)
    say(f"[sweep {name}] t{trial.number} was interrupted; its point is queued again")


LEFT_RUNNING = "its run was left RUNNING by a worker that lost its trial"


def close_runs_left_running(study: optuna.Study) -> None:
    """Close the study's runs still RUNNING whose trial is neither running nor queued: one a
    worker reopened to resume just as its trial was taken over, or one a worker killed
    half-way through giving a trial back had yet to close. Each ends as the seed that last
    recorded it did (FAIL when none did)."""
    left = runs.running_trial_runs(study.study_name)  # read first: a run reopened later is live
    if not left:
        return
    live_numbers, live_runs, recorded = set(), set(), {}
    for trial in study.get_trials(deepcopy=False):  # in number order
        if trial.state in (TrialState.RUNNING, TrialState.WAITING):
            live_numbers.add(trial.number)
            live_runs |= _runs_named(trial)
        for rep in replicates(trial):
            if rep.state != State.RUNNING:
                recorded[rep.run_id] = rep  # the newest trial's record of a run wins
    for run_id, number in left.items():
        if number in live_numbers or run_id in live_runs:
            continue
        rep = recorded.get(run_id)
        runs.close_trial_run(
            run_id, rep.state if rep else State.FAIL, rep.reason if rep else LEFT_RUNNING
        )


def _runs_named(trial: FrozenTrial) -> set[str]:
    """Every run a trial names: its own, its seeds', and the ones it is to resume."""
    resume_dirs = trial.user_attrs.get(TrialAttr.RESUME_DIRS, {}).values()
    return {
        trial.user_attrs.get(TrialAttr.MLFLOW_RUN_ID),
        *(r.run_id for r in replicates(trial)),
        *(d.get("run_id") for d in resume_dirs),
    } - {None}


def _died(seed: int, started: Replicate | None, reason: str) -> Replicate:
    """The record of a seed whose job ended without writing one."""
    return Replicate(
        seed=seed,
        state=State.FAIL,
        value=None,
        stderr=None,
        steps_run=started.steps_run if started else 0,
        baseline=started.baseline if started else None,
        reason=reason,
        run_id=started.run_id if started else None,
    )
