"""The race's budget on a grid (hydra.sweeper.budget_seeds, sweeper/sweep/racing.py), on
hand-made trials: what it counts as spent and owed, and what a seed past the first two does
when the budget has room, may yet have room, or has none. Replayed sweeps: test_bench_cost.py."""

from __future__ import annotations

import pytest
from optuna.trial import FrozenTrial, TrialState, create_trial
from test_broken_seeds import KL, record, trial

from judge import race
from records.sweep import State, TrialAttr
from sweeper.plan.settings import resolve_settings
from sweeper.plan.settings_schema import GRPOSweeperConf
from sweeper.sweep import racing
from sweeper.sweep.racing import Budget, Spending, gated

SEED = race.Step(race.SEED, "2 seeds; not yet separated from t1")


def queued(number: int, **fixed) -> FrozenTrial:
    """A grid point not asked yet: its values wait in fixed_params."""
    t = create_trial(state=TrialState.WAITING, system_attrs={"fixed_params": fixed})
    t.number = number
    return t


def test_the_budget_counts_steps_run_seeds_running_at_full_length_and_seeds_still_owed():
    """max_steps 10, budget_seeds 2. t0: 2 seeds of 10 steps (20). t1: one seed stopped at
    step 4, one running, counted at its full 10 (14). t2 queued, its max_steps swept to 30: its
    2 seeds owed (60). t3 interrupted, its point queued again as t2: left out. Budget: 2 seeds
    x (10 + 10 + 30) = 100."""
    t0 = trial(
        0, TrialState.COMPLETE, record(0, State.COMPLETE, 0.5), record(1, State.COMPLETE, 0.5)
    )
    t1 = trial(
        1, TrialState.RUNNING, record(0, State.PRUNED, breach=KL, steps=4), record(1, State.RUNNING)
    )
    t2 = queued(2, max_steps=30)
    t3 = trial(3, TrialState.FAIL, record(0, State.COMPLETE, 0.4))
    t3.set_user_attr(TrialAttr.INTERRUPTED, True)
    spending = racing.spending([t0, t1, t2, t3], Budget(2, 10))
    assert spending == Spending(spent=34, owed=60, budget=100, seeds=2, settled=False)
    assert spending.room_for(6) and not spending.room_for(7)  # 34 + 60 + 6 = 100
    # a third seed this worker decided t1 runs, not started yet, is owed as well
    assert racing.spending([t0, t1, t2, t3], Budget(2, 10, {1: 3})).owed == 70


def test_settled_once_no_seed_runs_and_none_is_owed():
    t0 = trial(
        0, TrialState.RUNNING, record(0, State.COMPLETE, 0.5), record(1, State.COMPLETE, 0.5)
    )
    t1 = trial(
        1,
        TrialState.PRUNED,
        record(0, State.PRUNED, breach=KL, steps=4),
        record(1, State.PRUNED, breach=KL, steps=4),
    )
    spending = racing.spending([t0, t1], Budget(2, 10))
    assert spending == Spending(spent=28, owed=0, budget=40, seeds=2, settled=True)
    assert spending.room_for(10)  # the 12 steps the health rules saved buy t0 a third seed


def test_a_seed_past_the_first_two_runs_with_room_waits_while_room_may_come_else_stops():
    assert gated(SEED, Spending(28, 0, 40, 2, True), 10) is SEED
    held = gated(SEED, Spending(34, 60, 100, 2, False), 10)
    assert held == race.Step(
        race.HOLD,
        "2 seeds; not yet separated from t1; waits for room within budget_seeds=2, "
        "a 2-seed grid's 100 steps",
    )
    stopped = gated(SEED, Spending(40, 0, 40, 2, True), 10)
    assert stopped == race.Step(
        race.STOP,
        "2 seeds; not yet separated from t1, but one more would pass budget_seeds=2, "
        "a 2-seed grid's 40 steps",
    )
    # the first two seeds are every configuration's, and a stop or a hold is left as it is
    assert gated(SEED, Spending(40, 0, 40, 2, True), 10, beyond=False) is SEED
    stop = race.Step(race.STOP, "separated from every other after 2 seeds")
    assert gated(stop, Spending(40, 0, 40, 2, True), 10) is stop


def test_the_budget_gates_a_grid_only():
    """Two configurations 0.02 apart with seeds 0.002 apart: the leader's race wants a third
    seed, which a settled 2-seed budget has no room for on a grid; a search (not a grid) is
    not capped."""
    t0 = trial(
        0, TrialState.RUNNING, record(0, State.COMPLETE, 0.502), record(1, State.COMPLETE, 0.498)
    )
    t1 = trial(
        1,
        TrialState.COMPLETE,
        record(0, State.COMPLETE, 0.478),
        record(1, State.COMPLETE, 0.482),
        lr=2e-3,
    )
    budget = Budget(2, 10)
    free = racing.look([t0, t1], t0, 3, True, False, 0.02)
    assert free.action == race.SEED
    assert racing.look([t0, t1], t0, 3, True, False, 0.02, budget=budget) == free
    capped = racing.look([t0, t1], t0, 3, True, True, 0.02, budget=budget)
    assert capped.action == race.STOP and "budget_seeds=2, a 2-seed grid's 40 steps" in capped.why
    assert racing.look([t0, t1], t0, 3, True, True, 0.02, budget=Budget(0, 10)) == free


@pytest.mark.parametrize("value", [1, -1])
def test_a_budget_below_two_seeds_is_refused_in_one_line(value):
    from sweeper import SweepError

    with pytest.raises(SweepError) as e:
        resolve_settings(GRPOSweeperConf(budget_seeds=value), 0.1)
    assert str(e.value) == (
        f"hydra.sweeper.budget_seeds={value}: must be 0 (no cap) or >= 2 "
        "(every raced configuration gets 2 seeds)"
    )
