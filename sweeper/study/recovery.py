"""Trials lost to the infrastructure, told apart from trials that failed.

A trial is lost when its run could not end on its own account: its process or its sweeper
died (no record, a record still RUNNING, a heartbeat that stopped), or a store stayed
unreachable past the retry window (records.database.DatabaseUnreachable). A lost trial is
recorded interrupted, which counts toward nothing (not max_failure_rate), and its point is
queued again to resume from its last checkpoint (slots.give_back). The same point lost
`max_lost_in_a_row` times in a row, each time without saving a checkpoint, fails with the
reason: a run that kills its own worker (out of memory) must not loop forever, while one that
gets further each time (a busy preemptible cluster) is not a loop. A genuine failure (an exception in training, NaN) is
recorded by its job and stays FAIL.
"""

from __future__ import annotations

from collections.abc import Mapping

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial

from records.database import DatabaseUnreachable, is_unreachable
from records.errors import first_line
from records.sweep import Replicate, State, TrialAttr, replicates
from sweeper import optuna_adapter as oa
from trainer.base.errors import fail_reason


def lost_reason(
    errors: Mapping[int, BaseException | None], recorded: Mapping[int, Replicate]
) -> str | None:
    """Why a configuration's run was lost (None: each seed ended on its own account, or one
    was pruned or failed, which is the configuration's verdict). errors: {seed: what its job
    raised}; recorded: {seed: what it recorded}."""
    if any(r.state in (State.PRUNED, State.FAIL) for r in recorded.values()):
        return None
    for seed, error in errors.items():
        if isinstance(error, DatabaseUnreachable) or (error is not None and is_unreachable(error)):
            return first_line(error)
        record = recorded.get(seed)
        if record is None or record.state == State.RUNNING:
            what = fail_reason(error) if error is not None else "it ended without a record"
            return f"its job died ({what})"
    return None


def interrupt(study: optuna.Study, trial_id: int, reason: str) -> bool:
    """Record a trial in flight as interrupted (FAIL, counted toward nothing) so that its
    point can be queued again; False when it had ended already (another worker, or the trial
    itself, got there first). The reason goes first: a finished trial's attrs are read-only."""
    try:
        oa.set_attr(study, trial_id, TrialAttr.FAIL_REASON, reason)
        oa.set_attr(study, trial_id, TrialAttr.INTERRUPTED, True)
        oa.fail(study, trial_id)
    except UpdateFinishedTrialError:
        return False
    return True


def lose(study: optuna.Study, trial_id: int, reason: str, max_in_a_row: int) -> bool:
    """A trial lost to the infrastructure: interrupted, its point to be queued again, or
    failed with the reason once its point was lost max_in_a_row times in a row with no new
    checkpoint. False when it had ended already. Call under optuna_storage.exclusive."""
    trial = oa.fresh(study, trial_id)
    saved = checkpoints_saved(trial)
    seen = set(trial.user_attrs.get(TrialAttr.CHECKPOINTS_SEEN, []))
    row = 0 if saved - seen else trial.user_attrs.get(TrialAttr.LOST_IN_A_ROW, 0)
    lost = row + 1
    try:
        oa.set_attr(study, trial_id, TrialAttr.CHECKPOINTS_SEEN, sorted(saved))
        oa.set_attr(study, trial_id, TrialAttr.LOST_IN_A_ROW, lost)
        if lost < max_in_a_row:
            return interrupt(study, trial_id, f"lost: {reason}; queued again")
        why = f"lost {lost} times in a row (hydra.sweeper.max_lost_in_a_row), last: {reason}"
        oa.set_attr(study, trial_id, TrialAttr.FAIL_REASON, why)
        oa.fail(study, trial_id)
    except UpdateFinishedTrialError:
        return False
    return True


def checkpoints_saved(trial: FrozenTrial) -> set[str]:
    """The checkpoint folders its seeds' runs have saved (either backend's layout): a name
    not there when it was last lost means it got further."""
    from trainer.backends import checkpoint_dirs

    return {
        str(folder)
        for seed in replicates(trial)
        if seed.output_dir
        for folder in checkpoint_dirs(seed.output_dir)
    }


def fail_stale_trials(study: optuna.Study, reason: str, max_in_a_row: int) -> list[FrozenTrial]:
    """Lose the RUNNING trials whose heartbeat stopped (their sweeper died); return the ones
    this process recorded. Like `optuna.storages.fail_stale_trials`, but exactly one racing
    worker wins each trial, and the reason is kept."""
    return [
        oa.fresh(study, trial_id)
        for trial_id in oa.stale_trial_ids(study)
        if lose(study, trial_id, reason, max_in_a_row)
    ]
