"""Racing seeds (`hydra.sweeper.seeds=auto`) in a live study: what one configuration does next.

- The decision is the judge's (judge/race.py); this reads the study's trials for it.
- A configuration's trial is told once, when its race ends: an Optuna trial's value cannot
  change after it completes, and TPE should learn the configuration's mean, not each seed.
- While it races its trial stays RUNNING (TPE counts it as in flight), and its seeds are the
  trial's replicate records, so a resumed or joining worker sees every seed that ended.
- On a grid the race spends at most a `budget_seeds`-seed grid's training steps (`Budget`):
  a seed past MIN_SEEDS runs only where the steps the grid has spent and still owes leave
  room for it, which the health rules' early stops make (issue 72: on a small grid nothing
  stops early, and a third seed would cost more than the 2-seed grid).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from optuna.trial import FrozenTrial, TrialState

from judge.configs import config_of, counted
from judge.race import HOLD, HOPEFUL, POWER, SEED, STOP, Step, decide, minimal_difference
from judge.stats import MIN_SEEDS
from records.sweep import State, is_interrupted, replicates
from sweeper.study.slots import point_of


@dataclass(frozen=True)
class Budget:
    """A grid race's spending cap: the training steps of a grid of `seeds` seeds (0: none)."""

    seeds: int
    max_steps: int  # a configuration's steps, unless it sets max_steps itself
    # Seeds this worker has decided each trial (by number) runs: the trials record a seed
    # only once it starts (another worker's decided seed counts from then).
    planned: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Spending:
    """A grid's training steps, as the budget counts them."""

    spent: int  # steps the ended seeds ran, and max_steps for each seed still running
    owed: int  # max_steps for each seed decided on, or of the MIN_SEEDS, not yet started
    budget: int  # budget.seeds x max_steps over the grid's configurations
    seeds: int  # budget.seeds
    settled: bool  # no seed runs and none is owed: `spent` is final

    def room_for(self, steps: int) -> bool:
        return self.spent + self.owed + steps <= self.budget


def look(
    trials: Sequence[FrozenTrial],
    me: FrozenTrial,
    max_seeds: int,
    maximize: bool,
    grid: bool,
    min_difference: float | None = None,
    wait_for_leader: bool = True,
    futility: str = POWER,
    leader_rule: str = HOPEFUL,
    floor: float | None = None,
    budget: Budget | None = None,
) -> Step:
    """`decide` for one configuration's trial, from the study's trials as they are now.

    Open (RUNNING) and told (COMPLETE) configurations count with their completed seeds; a
    grid's queued configurations and those short of MIN_SEEDS values are still to come. The
    level is corrected for every configuration the study holds, queued (WAITING) included,
    so a grid's first looks are as strict as its verdict. min_difference: the setting
    (hydra.sweeper.min_difference; None: the eval's standard error, `minimal_difference`).
    wait_for_leader: a grid's stops against a leader still racing wait (False: the race
    before that rule, which bench/bench_cost.py replays beside it). futility, leader_rule:
    judge/race.py's (the defaults are the sweeper's; bench_cost replays the others). floor:
    what a seed that broke counts at (judge/configs.py break_floor; None: it is not counted).
    budget: a grid's cap (`gated`; None or 0 seeds: none).
    """
    others, more_to_come, queued = [], False, 0
    for t in trials:
        if t.number == me.number or not (t.state == TrialState.RUNNING or counted(t, floor)):
            more_to_come |= t.state == TrialState.WAITING
            queued += t.state == TrialState.WAITING
            continue
        entry = config_of(t, floor)
        others.append(entry)
        more_to_come |= t.state == TrialState.RUNNING and len(entry.values) < MIN_SEEDS
    configurations = 1 + len(others) + queued
    if min_difference is None:
        raced = [t for t in trials if t.state in (TrialState.RUNNING, TrialState.COMPLETE)]
        min_difference = minimal_difference(
            [r.stderr for t in raced for r in replicates(t) if r.state == State.COMPLETE]
        )
    step = decide(
        config_of(me, floor),
        others,
        max_seeds,
        maximize,
        grid and more_to_come,
        configurations,
        min_difference,
        grid and wait_for_leader,
        futility,
        leader_rule,
    )
    if grid and budget is not None and budget.seeds:
        beyond = len(replicates(me)) >= MIN_SEEDS  # the first MIN_SEEDS are owed, not gated
        return gated(step, spending(trials, budget), steps_of(me, budget.max_steps), beyond)
    return step


def gated(step: Step, spending: Spending, steps: int, beyond: bool = True) -> Step:
    """A seed past the first MIN_SEEDS (`beyond`) runs only if the budget has room for its
    `steps`; while seeds still run or are owed (an early stop would make room) it holds; else
    it stops."""
    if step.action != SEED or not beyond or spending.room_for(steps):
        return step
    n = spending.seeds
    cap = f"budget_seeds={n}, a {n}-seed grid's {spending.budget:,} steps"
    if not spending.settled:
        return Step(HOLD, f"{step.why}; waits for room within {cap}")
    return Step(STOP, f"{step.why}, but one more would pass {cap}")


def steps_of(trial: FrozenTrial, max_steps: int) -> int:
    """The training steps one seed of the trial's configuration runs to."""
    return int(point_of(trial).get("max_steps", max_steps))


def spending(trials: Sequence[FrozenTrial], budget: Budget) -> Spending:
    """What the grid has spent and still owes. A point queued again after an interrupt is one
    configuration: its interrupted trial is left out (the seeds that ended carry over)."""
    spent = owed = configurations_steps = 0
    settled = True
    for t in trials:
        if is_interrupted(t):
            continue
        steps = steps_of(t, budget.max_steps)
        configurations_steps += steps
        seeds = replicates(t)
        running = sum(r.state == State.RUNNING for r in seeds)
        spent += sum(r.steps_run or 0 for r in seeds if r.state != State.RUNNING)
        spent += running * steps
        due = budget.planned.get(t.number, 0 if t.state.is_finished() else MIN_SEEDS)
        owed += max(0, due - len(seeds)) * steps
        settled &= running == 0
    settled &= owed == 0
    return Spending(spent, owed, budget.seeds * configurations_steps, budget.seeds, settled)
