"""The race's decision for one configuration (`hydra.sweeper.seeds=auto`): seed, stop or hold.

Pure: it takes every configuration's completed seed values and answers for one of them. The
rules, in the order they are checked (bench/COST.md and bench/RACING.md measure each):
  - fewer than MIN_SEEDS seeds: one more (one seed has no seed-to-seed variance);
  - eliminated: the leader (the best seed-adjusted mean) is better beyond the interval;
  - cannot beat the leader: even at its one-sided 95% upper bound (stats.reversal_bound) it
    would gain less than min_difference;
  - the leader on fewer seeds than a rival it is not separated from, while more seeds could
    still separate them: one more (the verdict's pick is not left on a short, lucky record);
  - cap: max_seeds reached;
  - not yet separated from a rival, and more seeds could separate them: one more;
  - tied for good: even an optimistic difference (stats.difference_bound) is below
    min_difference, or a difference of min_difference itself would not separate within
    max_seeds seeds each at the study's pooled seed variance (stats.seeds_to_separate):
    more seeds cannot change the verdict (issue 72; `futility` keeps the rule before it);
  - separated from every other: stop.
Levels are Bonferroni-corrected over the looks a configuration can have and the comparisons
with the leader (stats.look_level). In a grid, a leader still waiting for configurations to
come holds, and a stop judged against a leader that still races waits for its last mean.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from judge import stats
from judge.compare import Judge, signed
from judge.configs import Config
from judge.stats import MIN_SEEDS, look_level, seeds_to_separate


@dataclass(frozen=True)
class Step:
    """What a configuration does after a look."""

    action: str  # SEED (run one more), STOP (tell its trial), HOLD (wait for the others)
    why: str  # one line for the table, the verdict and MLflow


SEED, STOP, HOLD = "seed", "stop", "hold"
# How a stop against the leader begins: the verdict reads them back from the trial's record
ELIMINATED, CANNOT_BEAT = "eliminated", "cannot beat"
# What a pair not yet separated is judged futile on (`_futile`): OPTIMISTIC, the difference at
# its one-sided 95% upper bound; POWER, min_difference (the difference that counts).
OPTIMISTIC, POWER = "optimistic", "power"
# When the leader gets a seed for being on fewer seeds than a rival it is not separated from:
# ALWAYS, or only while that rival is HOPEFUL (more seeds could still separate them).
ALWAYS, HOPEFUL = "always", "hopeful"
# The default race (issue 72, bench/COST.md): POWER futility, the HOPEFUL leader rule and
# max_seeds=3 (hydra.sweeper.max_seeds, sweeper/plan/settings_schema.py). Chosen on the
# calibration pools: the race before it (OPTIMISTIC, ALWAYS, max_seeds=5) spent 0.99-1.04 of a
# with-rules 3-seed grid's steps, since at 2 seeds the optimistic bound is wide enough to keep
# nearly every pair racing.


def decide(
    me: Config,
    others: Sequence[Config],
    max_seeds: int,
    maximize: bool,
    more_to_come: bool,
    configurations: int = 0,
    min_difference: float = 0.0,
    wait_for_leader: bool = False,
    futility: str = POWER,
    leader_rule: str = HOPEFUL,
) -> Step:
    """The next step of `me`, whose started seeds have all ended.

    others: every other configuration of the study with completed values (open or told).
    more_to_come: configurations not yet known (queued, or with fewer than MIN_SEEDS values)
    will join; a leader separated from the known ones then holds (a grid), so that a late
    close one can still make it run more seeds, rather than stop with a short record.
    configurations: how many the study holds, queued ones included (a grid's all from the
    start); the level is corrected for comparing each with the leader (at least the ones
    with values).
    min_difference: the smallest difference worth seeds (see `minimal_difference`).
    wait_for_leader: a configuration that cannot beat an open leader, or is tied with it for
    good, holds instead of stopping, and looks again once the leader is told (a grid).
    """
    n = len(me.values)
    if n < MIN_SEEDS:
        return Step(SEED, f"{n} of the {MIN_SEEDS} seeds every configuration gets")
    known = [o for o in others if len(o.values) >= MIN_SEEDS]
    level = look_level(max_seeds, max(configurations, 1 + len(known)))
    # one order whoever looks, so that every configuration sees the same leader (a tie, or
    # the blocked fit's rounding in another order, would otherwise name two leaders)
    entries = sorted([me, *known], key=lambda e: e.label)
    judge = Judge(entries, raced=True)
    sign = 1 if maximize else -1
    leader = max(entries, key=lambda e: stats.rank_value(sign * judge.mean(e)))
    if leader is not me:
        gap = signed(judge.difference(leader, me, level), sign)
        if gap.known and gap.low > 0:
            return Step(
                STOP, f"{ELIMINATED} after {n} seeds: {leader.label} is better by {_show(gap)}"
            )
        most = stats.reversal_bound(gap, stats.FUTILITY_LEVEL)
        if min_difference > 0 and most < min_difference:  # 0: every difference is chased
            return _stop_or_wait(
                f"{CANNOT_BEAT} {leader.label} after {n} seeds: by at most {most:.3g} "
                f"({stats.FUTILITY_LEVEL:.0%} upper bound), below min_difference="
                f"{min_difference:.3g}",
                leader,
                wait_for_leader,
            )
    rivals = [o for o in known if o is not leader] if leader is me else [leader]
    undecided = [o for o in rivals if not judge.difference(me, o, level).excludes_zero]
    futile = {
        o.label: _futile(me, o, judge, level, max_seeds, min_difference, futility)
        for o in undecided
    }
    more_seeded = [o for o in undecided if len(o.values) > n] if leader is me else []
    if leader_rule == HOPEFUL:
        more_seeded = [o for o in more_seeded if not futile[o.label]]
    if more_seeded and n < max_seeds:
        o = more_seeded[0]
        return Step(
            SEED,
            f"{n} seeds; leads {o.label}, not separated, on fewer seeds than its {len(o.values)}",
        )
    if n >= max_seeds:
        ties = ", ".join(o.label for o in undecided)
        tied = f", tied with {ties}" if ties else ""
        return Step(STOP, f"reached max_seeds={max_seeds}{tied}")
    hopeful = [o for o in undecided if not futile[o.label]]
    if hopeful:
        return Step(SEED, f"{n} seeds; not yet separated from {hopeful[0].label}")
    if undecided and leader is me and more_to_come:
        return Step(HOLD, f"{n} seeds; leads the configurations known so far, tied")
    if undecided:
        o = undecided[0]
        why = f"tied with {o.label} after {n} seeds: {futile[o.label]}"
        return _stop_or_wait(why, leader, wait_for_leader and leader is not me)
    if leader is me and more_to_come:
        return Step(HOLD, f"{n} seeds; leads the configurations known so far")
    if leader is me:
        return Step(STOP, f"separated from every other after {n} seeds")
    return Step(STOP, f"{n} seeds; separated from the leader {leader.label}")


def _futile(
    a: Config,
    b: Config,
    judge: Judge,
    level: float,
    max_seeds: int,
    min_difference: float,
    futility: str = OPTIMISTIC,
) -> str:
    """Why more seeds cannot change the call on a and b ("" while they can): even the
    optimistic difference is below the one that counts, or the difference judged on
    (`futility`) would not separate in max_seeds seeds each."""
    diff = judge.difference(a, b, level)
    pool = judge.variance(diff)
    bound = stats.difference_bound(diff, stats.FUTILITY_LEVEL)
    plausible = f"{bound:.3g} ({stats.FUTILITY_LEVEL:.0%} upper bound)"
    if bound < min_difference:
        return f"the difference is at most {plausible}, below min_difference={min_difference:.3g}"
    if futility != OPTIMISTIC and min_difference > 0:  # 0: only the optimistic bound stops
        bound, plausible = min_difference, f"min_difference={min_difference:.3g}"
    need = seeds_to_separate(a.values, b.values, level, pool, bound)
    if need <= max_seeds:
        return ""
    shown = f"~{need}" if math.isfinite(need) else "more than any practical number of"
    return f"even a difference of {plausible} would take {shown} seeds each (max_seeds={max_seeds})"


def _stop_or_wait(why: str, leader: Config, wait_for_leader: bool) -> Step:
    """A stop judged against the leader's mean so far: while the leader still races, it holds
    (its trial open), to be judged again on the leader's last mean."""
    if wait_for_leader and leader.open:
        return Step(HOLD, f"{why}; waits for {leader.label} to end its race")
    return Step(STOP, why)


def _show(i: stats.Interval) -> str:
    return f"{i.estimate:.3g} (CI {i.low:.3g} to {i.high:.3g})"


def minimal_difference(stderrs: Sequence[float | None]) -> float:
    """The default difference that counts: the eval's standard error over problems, averaged
    over the seeds that logged one (0 when none did: only the optimistic bound then stops a
    race). A difference below it is one a single run's eval cannot see."""
    known = [s for s in stderrs if s is not None and math.isfinite(s)]
    return sum(known) / len(known) if known else 0.0
