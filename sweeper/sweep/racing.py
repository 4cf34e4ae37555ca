"""Racing seeds (`hydra.sweeper.seeds=auto`): more seeds only where they can change the verdict.

Pure: the sweeper hands over every configuration's completed seed values (all workers
together, read from the study) and gets back what one configuration does next. Each
configuration starts with MIN_SEEDS seeds (one seed has no seed-to-seed variance, so nothing
is eliminated on it); once all its started seeds have ended, it is compared with the leader
(the best mean among configurations with MIN_SEEDS values) by a t interval paired by seed:
the sweeper gives every configuration the same seeds, so the race fits configuration + seed
over every configuration with MIN_SEEDS values and judges on its residual variance
(judge/stats.py blocked_fit; unpaired on the seed-to-seed variance pooled over them,
pooled_difference, for configurations whose seeds do not connect them), at a level corrected for looking after every seed and
for comparing with the leader every configuration there is: Bonferroni over the
max_seeds - MIN_SEEDS + 1 looks a configuration can have times the k - 1 comparisons with the
leader among the k configurations known (without the second factor, replays called a truly
tied pair decided in 1 of 200, bench/RACING.md). Why pooled: a
2-seed spread is one degree of freedom, and two draws that happen to be close made Welch's
interval narrow enough to call a truly tied pair decided (1 in 200 replays, bench/RACING.md),
while a truly separated pair took 3-4 seeds to eliminate on Welch's wide intervals; pooled
over 5 configurations at 2 seeds the spread has 5 degrees of freedom and no single pair's
luck decides. Then exactly one of:
  - eliminated: the leader is better beyond the interval -> no more seeds;
  - cannot beat the leader: even at its one-sided 95% upper confidence bound
    (judge/stats.py reversal_bound), it would be better than the leader by less than
    min_difference -> no more seeds. What a verdict's regret needs is the best, not proof of
    how much worse the others are: without this rule a slow learner 0.029 below the best took
    4.2 seeds to be eliminated at the corrected level (bench/COST.md, "Cannot beat the
    leader");
  - tied for good: even an optimistic difference, |difference| at its one-sided 95% upper
    confidence bound (judge/stats.py difference_bound), would stay inside the interval at
    max_seeds, or is below the minimal difference that counts (min_difference: a difference
    the eval cannot see on one run is not worth seeds) -> no more seeds, the verdict calls it
    a tie. Optimistic, not the observed difference: two seeds' difference is mostly noise,
    and judging futility on it abandoned differences 4-5 seeds would show (bench/RACING.md);
  - cap: it has max_seeds seeds -> no more seeds;
  - separated: the leader is better than every other contender -> no more seeds;
  - otherwise it gets one more seed at once (no lane waits for a round to end).
The leader is the verdict's pick, so it is not left on fewer seeds than a rival it is not
separated from (it gets one more, under the cap), and in a grid it holds while configurations
are still to come rather than stop as tied: replays where the pick had fewer seeds than a
tied rival had 3x the regret (a close runner-up whose first seeds drew high), and with this
rule racing's regret fell below a seeds=3 grid's (bench/COST.md, "The default").
In a grid, a stop judged against a leader that still races (it cannot beat the leader, or is
tied with it for good) waits instead: the configuration holds, its trial open, and is judged
again once the leader is told, on the leader's last mean. The leader is often the one whose
first seeds drew high, and its later seeds bring it down; judged again, the held one may lead
on fewer seeds and race on (bench/COST.md, "Waiting for the leader").

Why the configuration's trial is told once, when its race ends: an Optuna trial's value
cannot change after it completes, and TPE should learn the configuration's mean, not each
seed as if it were another configuration. Its trial stays RUNNING while it races (TPE treats
it as a trial in flight), and its seeds are the trial's replicate records, so a resumed or
joining worker sees every seed that ended.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from optuna.trial import FrozenTrial, TrialState

from judge import stats
from judge.compare import Judge, signed
from judge.configs import Config, config_of
from judge.stats import MIN_SEEDS, look_level, seeds_to_separate
from records.sweep import State, replicates


@dataclass(frozen=True)
class Step:
    """What a configuration does after a look."""

    action: str  # SEED (run one more), STOP (tell its trial), HOLD (wait for the others)
    why: str  # one line for the table, the verdict and MLflow


SEED, STOP, HOLD = "seed", "stop", "hold"


def decide(
    me: Config,
    others: Sequence[Config],
    max_seeds: int,
    maximize: bool,
    more_to_come: bool,
    configurations: int = 0,
    min_difference: float = 0.0,
    wait_for_leader: bool = False,
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
                STOP, f"eliminated after {n} seeds: {leader.label} is better by {_show(gap)}"
            )
        most = stats.reversal_bound(gap, stats.FUTILITY_LEVEL)
        if min_difference > 0 and most < min_difference:  # 0: every difference is chased
            return _stop_or_wait(
                f"cannot beat {leader.label} after {n} seeds: by at most {most:.3g} "
                f"({stats.FUTILITY_LEVEL:.0%} upper bound), below min_difference="
                f"{min_difference:.3g}",
                leader,
                wait_for_leader,
            )
    rivals = [o for o in known if o is not leader] if leader is me else [leader]
    undecided = [o for o in rivals if not judge.difference(me, o, level).excludes_zero]
    more_seeded = [o for o in undecided if len(o.values) > n] if leader is me else []
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
    futile = {o.label: _futile(me, o, judge, level, max_seeds, min_difference) for o in undecided}
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
    a: Config, b: Config, judge: Judge, level: float, max_seeds: int, min_difference: float
) -> str:
    """Why more seeds cannot change the call on a and b ("" while they can): even the
    optimistic difference is below the one that counts, or would not separate in max_seeds."""
    diff = judge.difference(a, b, level)
    pool = judge.variance(diff)
    bound = stats.difference_bound(diff, stats.FUTILITY_LEVEL)
    plausible = f"{bound:.3g} ({stats.FUTILITY_LEVEL:.0%} upper bound)"
    if bound < min_difference:
        return f"the difference is at most {plausible}, below min_difference={min_difference:.3g}"
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


def look(
    trials: Sequence[FrozenTrial],
    me: FrozenTrial,
    max_seeds: int,
    maximize: bool,
    grid: bool,
    min_difference: float | None = None,
    wait_for_leader: bool = True,
) -> Step:
    """`decide` for one configuration's trial, from the study's trials as they are now.

    Open (RUNNING) and told (COMPLETE) configurations count with their completed seeds; a
    grid's queued configurations and those short of MIN_SEEDS values are still to come. The
    level is corrected for every configuration the study holds, queued (WAITING) included,
    so a grid's first looks are as strict as its verdict. min_difference: the setting
    (hydra.sweeper.min_difference; None: the eval's standard error, `minimal_difference`).
    wait_for_leader: a grid's stops against a leader still racing wait (False: the race
    before that rule, which bench/bench_cost.py replays beside it).
    """
    others, more_to_come, queued = [], False, 0
    for t in trials:
        if t.number == me.number or t.state not in (TrialState.RUNNING, TrialState.COMPLETE):
            more_to_come |= t.state == TrialState.WAITING
            queued += t.state == TrialState.WAITING
            continue
        entry = config_of(t)
        others.append(entry)
        more_to_come |= t.state == TrialState.RUNNING and len(entry.values) < MIN_SEEDS
    configurations = 1 + len(others) + queued
    if min_difference is None:
        raced = [t for t in trials if t.state in (TrialState.RUNNING, TrialState.COMPLETE)]
        min_difference = minimal_difference(
            [r.stderr for t in raced for r in replicates(t) if r.state == State.COMPLETE]
        )
    return decide(
        config_of(me),
        others,
        max_seeds,
        maximize,
        grid and more_to_come,
        configurations,
        min_difference,
        grid and wait_for_leader,
    )


def minimal_difference(stderrs: Sequence[float | None]) -> float:
    """The default difference that counts: the eval's standard error over problems, averaged
    over the seeds that logged one (0 when none did: only the optimistic bound then stops a
    race). A difference below it is one a single run's eval cannot see."""
    known = [s for s in stderrs if s is not None and math.isfinite(s)]
    return sum(known) / len(known) if known else 0.0
