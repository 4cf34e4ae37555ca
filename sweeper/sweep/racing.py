"""Racing seeds (`hydra.sweeper.seeds=auto`) in a live study: what one configuration does next.

- The decision is the judge's (judge/race.py); this reads the study's trials for it.
- A configuration's trial is told once, when its race ends: an Optuna trial's value cannot
  change after it completes, and TPE should learn the configuration's mean, not each seed.
- While it races its trial stays RUNNING (TPE counts it as in flight), and its seeds are the
  trial's replicate records, so a resumed or joining worker sees every seed that ended.
"""

from __future__ import annotations

from collections.abc import Sequence

from optuna.trial import FrozenTrial, TrialState

from judge.configs import config_of, counted
from judge.race import HOPEFUL, POWER, Step, decide, minimal_difference
from judge.stats import MIN_SEEDS
from records.sweep import State, replicates


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
    return decide(
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
