"""Racing seeds (judge/race.py) on hand-computed numbers: each decision a configuration
can reach after a look, and the verdict's words for a raced study."""

from __future__ import annotations

import pytest

from analysis.verdict import Config, Seed, verdict
from judge import stats
from judge.configs import config
from judge.race import (
    ALWAYS,
    HOLD,
    HOPEFUL,
    OPTIMISTIC,
    POWER,
    SEED,
    STOP,
    Step,
    decide,
    minimal_difference,
)
from judge.stats import look_level, seeds_to_separate
from sweeper import SweepError
from sweeper.plan.settings import resolve_settings
from sweeper.plan.settings_schema import GRPOSweeperConf
from sweeper.sweep.flights import InFlight, Phase, seeds_of

LEVEL_5 = 1 - 0.05 / 4  # max_seeds=5: looks after seeds 2, 3, 4 and 5


def test_each_look_is_corrected_for_the_looks_a_configuration_can_have():
    assert look_level(5) == pytest.approx(LEVEL_5)
    assert look_level(2) == pytest.approx(0.95)


def test_and_for_the_comparisons_with_the_leader_among_all_configurations():
    # 4 looks x 4 comparisons with the leader among 5 configurations: 0.05 / 16
    assert look_level(5, 5) == pytest.approx(1 - 0.05 / 16)
    assert look_level(2, 3) == pytest.approx(1 - 0.05 / 2)


def test_the_seed_variance_is_pooled_over_configurations_with_two_seeds_or_more():
    # squares about each mean: 2 x 0.02^2 = 0.0008 and 2 x 0.02^2 = 0.0008; df 1 + 2 = 3;
    # the one-seed configuration has no spread to give
    pool = stats.pooled_variance([(0.40, 0.44), (0.30, 0.34, 0.32), (0.1,)])
    assert (pool.variance, pool.df, pool.groups) == (pytest.approx(0.0016 / 3), 3, 2)
    # 0.42 - 0.32 = 0.10 +- t(3, 95%) 3.182 x sqrt(0.000533 x (1/2 + 1/3)) = 0.10 +- 0.0671
    gap = stats.pooled_difference((0.40, 0.44), (0.30, 0.34, 0.32), pool)
    assert (gap.low, gap.high) == (
        pytest.approx(0.03291, abs=1e-5),
        pytest.approx(0.16709, abs=1e-5),
    )
    assert gap.method == "pooled t over seeds (2 configurations, df 3)"
    assert not stats.pooled_difference((0.4, 0.5), (0.3, 0.4), stats.pooled_variance([])).known


def test_the_pooled_variance_is_raised_to_its_upper_confidence_bound():
    # 0.0016 / 3 on df 3, raised by 3 / chi2(0.40, 3) = 3 / 1.8692 = 1.6050: 0.000856;
    # 0.10 +- t(3, 95%) 3.182 x sqrt(0.000856 x (1/2 + 1/3)) = 0.10 +- 0.0850
    pool = stats.variance_bound(stats.pooled_variance([(0.40, 0.44), (0.30, 0.34, 0.32)]))
    assert (pool.variance, pool.df, pool.bound) == (pytest.approx(0.000856, abs=1e-6), 3, 0.6)
    gap = stats.pooled_difference((0.40, 0.44), (0.30, 0.34, 0.32), pool)
    assert (gap.low, gap.high) == (pytest.approx(0.0150, abs=1e-4), pytest.approx(0.1850, abs=1e-4))
    assert gap.method == (
        "pooled t over seeds (2 configurations, df 3, variance at its 60% upper bound)"
    )
    assert stats.variance_bound(stats.pooled_variance([])).df == 0


def test_a_raced_verdict_decides_at_a_level_four_times_stricter_than_a_look():
    # a look among 5 configurations with max_seeds=5 at 1 - 0.05/16; decided at 1 - 0.05/64
    assert stats.decided_level(5, 5) == pytest.approx(1 - 0.05 / 64)
    assert stats.decided_level(3, 2) == pytest.approx(1 - 0.05 / 8)


def test_two_close_draws_are_not_trusted_when_the_pool_says_seeds_spread_more():
    # Alone: pooled variance 0.00005 on df 2, raised by 2 / chi2(0.40, 2) = 1.9576: 0.0000979;
    # 0.08 +- t(2, 98.75%) 8.860 x 0.00989 = +- 0.0877: not eliminated, one more seed
    me, leader = config("t1", (0.20, 0.21)), config("t0", (0.28, 0.29))
    step = decide(me, [leader], 5, True, False)
    assert step.why == "2 seeds; not yet separated from t0"
    # A third configuration spreads 0.10: pooled (0.00005 + 0.00005 + 0.005) / 3 = 0.0017 on
    # df 3, raised by 1.6050: 0.00273. The observed 0.08 would need ~9 seeds each, but the
    # optimistic difference, 0.08 + t(3, one-sided 95%) 2.353 x 0.0522 = 0.203, would
    # separate within max_seeds: two seeds' gap is not trusted to call the race futile
    step = decide(me, [leader, config("t2", (0.10, 0.20))], 5, True, False)
    assert step.why == "2 seeds; not yet separated from t0"
    # A grid of 5 (3 still queued) judges the first looks as strictly as its verdict
    assert decide(me, [leader], 5, True, False, configurations=5).action == SEED


def test_seeds_to_separate_a_difference_that_stays_as_it_is():
    # diff 0.10, both sd 0.0283: n=2 gives 8.86 x 0.0283 x 1 = 0.25 > 0.10;
    # n=3 gives t(4, 0.99375) = 4.31 x 0.0283 x 0.816 = 0.0996 < 0.10
    assert seeds_to_separate((0.40, 0.44), (0.30, 0.34), LEVEL_5) == 3
    assert seeds_to_separate((0.40, 0.44), (0.38, 0.42), LEVEL_5) == 27
    # the race's pool is raised to its 60% bound (x 2 / 1.0217 on df 2): about twice the seeds
    raised = stats.variance_bound(stats.pooled_variance([(0.40, 0.44), (0.38, 0.42)]))
    assert seeds_to_separate((0.40, 0.44), (0.38, 0.42), LEVEL_5, raised) == 51
    assert seeds_to_separate((0.4, 0.5), (0.4, 0.5), LEVEL_5) == float("inf")


def test_the_optimistic_difference_is_the_upper_confidence_bound_of_the_gap():
    # pooled variance (0.0008 + 0.0008) / 2 = 0.0008 on df 2; se = sqrt(0.0008 x 1) = 0.028284;
    # 0.10 + t(2, one-sided 95%) 2.920 x 0.028284 = 0.10 + 0.08259 = 0.18259
    pool = stats.pooled_variance([(0.40, 0.44), (0.30, 0.34)])
    gap = stats.pooled_difference((0.40, 0.44), (0.30, 0.34), pool)
    bound = stats.difference_bound(gap, 0.95)
    assert bound == pytest.approx(0.18259, abs=1e-5)
    # n=2: t(2, 0.99375) 8.860 x 0.028284 = 0.2506 > 0.1826; n=3 (df 4): 4.315 x 0.028284 x
    # 0.8165 = 0.0996 < 0.1826
    assert seeds_to_separate((0.40, 0.44), (0.30, 0.34), LEVEL_5, pool, bound) == 3
    # the most the second could be better by: -0.10 + 0.08259 = -0.01741
    assert stats.reversal_bound(gap, 0.95) == pytest.approx(-0.01741, abs=1e-5)
    none = stats.pooled_difference((0.4, 0.5), (0.3,), stats.pooled_variance([]))
    assert stats.difference_bound(none) == float("inf")
    assert stats.reversal_bound(none) == float("inf")


def test_the_default_difference_that_counts_is_the_eval_stderr_over_the_seeds_run():
    assert minimal_difference([0.03, 0.05, None, float("nan")]) == pytest.approx(0.04)
    assert minimal_difference([None]) == 0.0


def test_a_negative_min_difference_is_refused_in_one_line():
    with pytest.raises(SweepError) as e:
        resolve_settings(GRPOSweeperConf(min_difference=-0.01), 0.01)
    assert str(e.value) == (
        "hydra.sweeper.min_difference=-0.01: must be >= 0, or null (eval stderr)"
    )
    assert resolve_settings(GRPOSweeperConf(min_difference=0.02), 0.01).min_difference == 0.02


def test_fewer_than_two_seeds_is_never_a_verdict():
    step = decide(config("t1", (0.1,)), [config("t0", (0.9, 0.9))], 5, True, False)
    assert step.action == SEED


def test_clearly_worse_than_the_leader_is_eliminated():
    # Welch at 98.75%: 0.205, CI 0.025 to 0.385 excludes 0
    step = decide(config("t1", (0.30, 0.31)), [config("t0", (0.50, 0.52))], 5, True, False)
    assert step.action == STOP and step.why.startswith("eliminated after 2 seeds: t0 is better")


def test_the_race_pairs_by_seed_where_the_configurations_share_seeds():
    # Seeds 0 and 1 each: configuration + seed residuals (1/300)(1, -1) for t1 and
    # (1/600)(-1, 1) for t0 and t2: SS 3.333e-5 on df (3-1)(2-1) = 2, 1.6667e-5, raised by
    # 2 / chi2(0.40, 2) = 1.9576: 3.2627e-5; se(t0 - t1) = sqrt(2 x 3.2627e-5 / 2) = 0.005712;
    # moderated toward the pair's own (per-seed differences 0.08, 0.09: variance 2.5e-5 once
    # halved) with PRIOR_DF 2: (2 x 3.2627e-5 + 2.5e-5) / 3 = 3.0085e-5, se 0.005485 on df 3;
    # at 1 - 0.05/8 (max_seeds=5, 3 configurations) t(3, 0.996875): 0.085 +- 0.0378
    me = config("t1", (0.20, 0.30), (0, 1))
    others = [config("t0", (0.28, 0.39), (0, 1)), config("t2", (0.10, 0.21), (0, 1))]
    step = decide(me, others, 5, True, False)
    assert step.why == "eliminated after 2 seeds: t0 is better by 0.085 (CI 0.0472 to 0.123)"
    # the same values, seeds unknown: unpaired, the shared seed effect stays in the noise
    unpaired = [config(e.label, e.values) for e in (me, *others)]
    assert decide(unpaired[0], unpaired[1:], 5, True, False).action == SEED


def test_one_that_cannot_beat_the_leader_by_the_difference_that_counts_stops():
    # pooled 0.0008 on df 2, raised by 2 / chi2(0.40, 2) = 1.9576: sd 0.03957, the se of the
    # difference at 2 seeds each; not eliminated (t(2, 0.99375) 8.860 x 0.03957 = 0.351 > 0.10).
    # The most t1 can be better by: -0.10 + t(2, one-sided 95%) 2.9200 x 0.039574 = 0.01556
    me, leader = config("t1", (0.30, 0.34)), config("t0", (0.40, 0.44))
    step = decide(me, [leader], 5, True, False, min_difference=0.015, futility=OPTIMISTIC)
    assert step.action == SEED
    # at 0.015 t1 may still beat t0, but 0.015 itself would take ~89 seeds each to separate
    # (sd 0.03957): tied for good since issue 72
    assert decide(me, [leader], 5, True, False, min_difference=0.015).why == (
        "tied with t0 after 2 seeds: even a difference of min_difference=0.015 would take ~89 "
        "seeds each (max_seeds=5)"
    )
    assert decide(me, [leader], 5, True, False, min_difference=0).action == SEED
    step = decide(me, [leader], 5, True, False, min_difference=0.02)
    assert step.action == STOP and step.why == (
        "cannot beat t0 after 2 seeds: by at most 0.0156 (95% upper bound), below "
        "min_difference=0.02"
    )
    # minimizing, the same values mirrored
    worse, best = config("t1", (0.70, 0.66)), config("t0", (0.60, 0.56))
    assert decide(worse, [best], 5, False, False, min_difference=0.02).why == step.why


def test_in_a_grid_one_that_cannot_beat_a_leader_still_racing_waits_for_its_last_mean():
    # the numbers of the test above: t1 can be better by at most 0.0156 < 0.02. While t0 races
    # (open), t1 holds, to be judged again on t0's last mean; once t0 is told, it stops
    me = config("t1", (0.30, 0.34))
    racing_leader, told_leader = config("t0", (0.40, 0.44), open=True), config("t0", (0.40, 0.44))
    stop = "cannot beat t0 after 2 seeds: by at most 0.0156 (95% upper bound), below "
    stop += "min_difference=0.02"
    step = decide(me, [racing_leader], 5, True, False, min_difference=0.02, wait_for_leader=True)
    assert step == Step(HOLD, f"{stop}; waits for t0 to end its race")
    step = decide(me, [told_leader], 5, True, False, min_difference=0.02, wait_for_leader=True)
    assert step == Step(STOP, stop)
    # outside a grid (TPE) nothing waits: a held trial would look in flight to the sampler
    assert decide(me, [racing_leader], 5, True, False, min_difference=0.02) == Step(STOP, stop)


def test_one_tied_for_good_with_a_leader_still_racing_waits_too():
    # the tie test's numbers below (~5 seeds each needed, max_seeds=4)
    me, leader = config("t1", (0.39, 0.43, 0.41)), config("t0", (0.40, 0.44, 0.42), open=True)
    step = decide(me, [leader], 4, True, False, wait_for_leader=True)
    assert step.action == HOLD and step.why.endswith("; waits for t0 to end its race")
    assert step.why.startswith("tied with t0 after 3 seeds: even a difference of 0.052")


def test_configurations_tied_to_the_last_digit_agree_on_which_one_leads():
    # a pair from a real replay (seeds 173-217): both means are 0.33, which the blocked fit
    # rounded up for whichever it was handed first, so each saw itself as the leader (and,
    # holding for the leader, a replay with a third one waited forever). Ranked past the
    # fit's float noise (stats.rank_value), the tie goes to the first by label, on any CPU.
    t2 = config("t2", (0.315, 0.325, 0.35), (0, 1, 2), open=True)
    t5 = config("t5", (0.3125, 0.3225, 0.355), (0, 1, 2), open=True)
    as_t2 = decide(t2, [t5], 5, True, False, 10, 0.0234, wait_for_leader=True)
    as_t5 = decide(t5, [t2], 5, True, False, 10, 0.0234, wait_for_leader=True)
    assert as_t5.why.startswith("cannot beat t2") and as_t5.action == HOLD
    assert as_t2.why.startswith("tied with t5") and as_t2.action == STOP


def power(me: Config, others: list[Config], max_seeds: int, min_difference: float) -> Step:
    """The default race's step for `me` (maximised, nothing to come)."""
    return decide(me, others, max_seeds, True, False, 0, min_difference, futility=POWER)


def test_power_futility_ties_a_pair_that_min_difference_could_not_separate_in_max_seeds():
    # issue 72. Pooled (0.00005 + 0.00005 + 0.005) / 3 = 0.0017 on df 3, raised by
    # 3 / chi2(0.40, 3) = 1.6050: 0.0027285, sd 0.05223; level 1 - 0.05/8 (max_seeds=5, 3
    # configurations). t1 may still beat t0: -0.08 + t(3, one-sided 95%) 2.353 x 0.05223 =
    # 0.0429 > 0.04. The optimistic difference, 0.08 + 0.1229 = 0.203, would separate within 5
    # seeds: the race before issue 72 seeded on. Judged at min_difference=0.04 itself: at n
    # seeds each (df 3 + 2(n - 2)), t(df, 0.996875) x 0.05223 x sqrt(2/n) < 0.04 first at
    # n = 28 (2.87 x 0.05223 x 0.2673 = 0.0400): more seeds cannot change the verdict.
    me, leader, t2 = (
        config("t1", (0.20, 0.21)),
        config("t0", (0.28, 0.29)),
        config("t2", (0.10, 0.20)),
    )
    old = decide(me, [leader, t2], 5, True, False, 0, 0.04, futility=OPTIMISTIC)
    assert old == Step(SEED, "2 seeds; not yet separated from t0")
    assert power(me, [leader, t2], 5, 0.04) == Step(
        STOP,
        "tied with t0 after 2 seeds: even a difference of min_difference=0.04 would take ~28 "
        "seeds each (max_seeds=5)",
    )
    # min_difference 0 (no eval stderr logged): only the optimistic bound can stop a race
    assert power(me, [leader, t2], 5, 0.0) == old


def test_power_futility_races_on_where_min_difference_could_be_separated():
    # Pooled 3 x 0.00005 / 3 on df 3, raised by 1.6050: 8.025e-5, sd 0.008958; t0 leads t1 by
    # 0.03, not separated at 1 - 0.05/8: t(3) 6.895 x 0.008958 = 0.0618. min_difference=0.025
    # separates at 4 seeds each (df 7): 3.855 x 0.008958 x 0.7071 = 0.0244 < 0.025 (at 3, df 5:
    # 4.526 x 0.008958 x 0.8165 = 0.0331): one more seed. 0.02 needs 6 > 5: tied.
    me, rival, t2 = (
        config("t0", (0.33, 0.34)),
        config("t1", (0.30, 0.31)),
        config("t2", (0.20, 0.21)),
    )
    assert power(me, [rival, t2], 5, 0.025) == Step(SEED, "2 seeds; not yet separated from t1")
    step = power(me, [rival, t2], 5, 0.02)
    assert step.action == STOP and step.why.endswith("would take ~6 seeds each (max_seeds=5)")
    # max_seeds=3 (level 1 - 0.05/4): 0.025 would take ~4 seeds each, more than 3
    step = power(me, [rival, t2], 3, 0.025)
    assert step.action == STOP and step.why.endswith("would take ~4 seeds each (max_seeds=3)")


def test_the_leader_on_fewer_seeds_seeds_on_only_against_a_hopeful_rival():
    # t0 leads on 2 seeds; t1 has 3. Pooled (0.00005 + 0.00005 + 0.005) / 4 on df 4, raised by
    # 4 / chi2(0.40, 4) = 1.4530: 0.0018526, sd 0.04304. min_difference=0.04 would take ~20
    # seeds each (n = 20, df 4 + 18 + 17 = 39: t 2.90 x 0.04304 x 0.3162 = 0.0395 < 0.04): the
    # pair is tied for good, so a third seed for the leader cannot change the verdict.
    me = config("t0", (0.28, 0.29))
    others = [config("t1", (0.20, 0.21, 0.205)), config("t2", (0.10, 0.20))]
    always = decide(me, others, 5, True, False, 0, 0.04, futility=POWER, leader_rule=ALWAYS)
    assert always == Step(SEED, "2 seeds; leads t1, not separated, on fewer seeds than its 3")
    step = decide(me, others, 5, True, False, 0, 0.04, futility=POWER, leader_rule=HOPEFUL)
    assert step == Step(
        STOP,
        "tied with t1 after 2 seeds: even a difference of min_difference=0.04 would take ~20 "
        "seeds each (max_seeds=5)",
    )
    # against a hopeful rival (the optimistic bound) the leader still gets its seed
    hopeful = decide(me, others, 5, True, False, 0, 0.04, futility=OPTIMISTIC, leader_rule=HOPEFUL)
    assert hopeful == always


def test_a_contender_that_more_seeds_could_separate_gets_one_more():
    step = decide(config("t1", (0.30, 0.34)), [config("t0", (0.40, 0.44))], 5, True, False)
    assert step.action == SEED and "not yet separated from t0" in step.why


def test_a_tie_even_the_optimistic_difference_would_not_break_stops_and_says_why():
    # pooled (0.0008 + 0.0008) / 4 = 0.0004 on df 4, raised by 4 / chi2(0.40, 4) = 1.4530:
    # 0.000581, sd 0.02411; optimistic: 0.01 + t(4, one-sided 95%) 2.132 x 0.02411 x sqrt(2/3)
    # = 0.0520. Level 1 - 0.05/3 (max_seeds=4): at 4 seeds (df 6) 3.287 x 0.02411 x 0.7071 =
    # 0.0560 > 0.0520, at 5 (df 8) 3.016 x 0.02411 x 0.6325 = 0.0460 < 0.0520: ~5 > 4
    step = decide(
        config("t1", (0.39, 0.43, 0.41)), [config("t0", (0.40, 0.44, 0.42))], 4, True, False
    )
    assert step.action == STOP
    assert step.why == (
        "tied with t0 after 3 seeds: even a difference of 0.052 (95% upper bound) would take "
        "~5 seeds each (max_seeds=4)"
    )


def test_two_seeds_keep_racing_unless_even_the_optimistic_difference_is_below_the_one_that_counts():
    # pooled 0.0008 on df 2, raised by 2 / chi2(0.40, 2) = 1.9576: sd 0.03957; optimistic
    # 0.02 + t(2, one-sided 95%) 2.920 x 0.03957 = 0.1356, separable at 4 seeds (df 6):
    # t(6, 0.99375) 3.521 x 0.03957 x 0.7071 = 0.0985 < 0.1356
    me, leader = config("t1", (0.38, 0.42)), config("t0", (0.40, 0.44))
    assert decide(me, [leader], 5, True, False).action == SEED
    step = decide(leader, [me], 5, True, False, min_difference=0.2)
    assert step.action == STOP
    assert step.why == (
        "tied with t1 after 2 seeds: the difference is at most 0.136 (95% upper bound), below "
        "min_difference=0.2"
    )
    # the one behind stops sooner: it cannot beat the leader (-0.02 + 0.1156 < 0.2)
    assert decide(me, [leader], 5, True, False, min_difference=0.2).why.startswith(
        "cannot beat t0 after 2 seeds: by at most 0.0956"
    )


def test_at_the_cap_it_stops_and_names_whom_it_is_tied_with():
    step = decide(config("t1", (0.30, 0.34, 0.36)), [config("t0", (0.40, 0.44))], 3, True, False)
    assert step.action == STOP and step.why == "reached max_seeds=3, tied with t0"


def test_the_leader_races_while_a_rival_is_close_and_holds_for_configurations_to_come():
    rival = config("t1", (0.30, 0.34))
    assert decide(config("t0", (0.40, 0.44)), [rival], 5, True, False).action == SEED
    far = config("t1", (0.10, 0.11))
    assert decide(config("t0", (0.40, 0.41)), [far], 5, True, True).action == HOLD
    step = decide(config("t0", (0.40, 0.41)), [far], 5, True, False)
    assert step.action == STOP and step.why == "separated from every other after 2 seeds"


def test_a_leader_tied_with_a_better_seeded_rival_gets_seeds_until_it_has_as_many():
    # t0 leads on 2 seeds (mean 0.42) a rival tied with it on 3 (0.41): a lucky pair of seeds
    # would otherwise be the pick (bench/COST.md: 3x the regret where the pick had fewer seeds)
    rival = config("t1", (0.39, 0.43, 0.41))
    step = decide(config("t0", (0.40, 0.44)), [rival], 4, True, False)
    assert step.action == SEED
    assert step.why == "2 seeds; leads t1, not separated, on fewer seeds than its 3"
    # on as many seeds, the same tie stops it (see the tie test above) ...
    assert decide(config("t0", (0.40, 0.44, 0.42)), [rival], 4, True, False).action == STOP
    # ... unless configurations are still to come, which may make it race on: it holds
    step = decide(config("t0", (0.40, 0.44, 0.42)), [rival], 4, True, True)
    assert (
        step.action == HOLD and step.why == "3 seeds; leads the configurations known so far, tied"
    )


def test_minimizing_eliminates_the_larger():
    step = decide(config("t1", (0.50, 0.52)), [config("t0", (0.30, 0.31))], 5, False, False)
    assert step.action == STOP and "eliminated" in step.why


def _config(
    label: str, values: tuple[float, ...], race: str = "", baseline=None, stderr=None
) -> Config:
    seeds = tuple(Seed(i, v, stderr) for i, v in enumerate(values))
    return Config(label, {"lr": 0.001}, seeds, baseline, race)


def test_a_raced_verdict_judges_at_the_race_level_and_says_runs_and_why():
    # at 95% (Welch, df 2) 0.10 +- 4.30 x 0.0283 = 0.10 +- 0.122: tied either way;
    # 0.5 vs 0.3 decided at 1 - 0.05/8 = 99.375% with 3 seeds each (a look is at 97.5%)
    configs = [
        _config("t0", (0.49, 0.50, 0.51), "reached max_seeds=3"),
        _config("t1", (0.30, 0.31, 0.29), "eliminated after 3 seeds: t0 is better by 0.2"),
    ]
    v = verdict(configs, True, max_seeds=3)
    assert v.decision.startswith("t0 (lr=0.001) beat every other, t1 by 0.2 (99.38% CI")
    assert v.lines[-1] == (
        "Seeds raced (seeds=auto, max_seeds=3, each look at 97.50%): 6 training runs, where "
        "max_seeds for every configuration would take 6. t0 3 (reached max_seeds=3); "
        "t1 3 (eliminated after 3 seeds)."
    )
    tied = verdict([_config("t0", (0.40, 0.44)), _config("t1", (0.38, 0.42))], True, 5)
    assert tied.decision.startswith("Tied at this sample size")
    # a configuration the race eliminated that the verdict's stricter level cannot call worse
    close = verdict(
        [
            _config("t0", (0.40, 0.41), "separated from every other after 2 seeds"),
            _config("t1", (0.30, 0.31), "eliminated after 2 seeds: t0 is better by 0.1"),
        ],
        True,
        5,
    )
    assert close.lines[-1].startswith(
        "t1: eliminated by the race (at its per-look level, 98.75%, more seeds were unlikely to "
        "make it the best), yet not decided worse than t0 at the verdict's 99.69%"
    )
    short = verdict(
        [
            _config("t0", (0.40, 0.44), "separated from every other after 2 seeds"),
            _config("t1", (0.30, 0.34), "cannot beat t0 after 2 seeds: by at most 0.0156"),
        ],
        True,
        5,
    )
    assert short.lines[-1] == (
        "t1: stopped by the race, as even at a 95% upper bound beating its leader by "
        "hydra.sweeper.min_difference was out of reach; not decided worse than t0 at the "
        "verdict's 99.69%, only given fewer seeds."
    )


def test_a_sweep_that_learned_nothing_says_so_first():
    configs = [
        _config("t0", (0.40, 0.41, 0.39), baseline=0.398, stderr=0.035),
        _config("t1", (0.405, 0.41, 0.40), baseline=0.398, stderr=0.035),
    ]
    v = verdict(configs, True)
    assert v.decision.startswith(
        "Nothing learned: no configuration moved off its baseline; the largest change is "
        "+0.007 (t1, 95% CI"
    )
    assert "lr (the largest tried here is 0.001) may be far below" in v.text
    moved = [_config("t0", (0.50, 0.51, 0.49), baseline=0.398)]
    assert not verdict(moved, True).decision.startswith("Nothing learned")


def test_a_configuration_looks_once_every_seed_it_will_start_has_ended():
    """flights.py's phases: training waits for every seed; broken, only for those started."""
    flight = InFlight(trial=None, seeds=[0, 1, 2], config_run_id=None)
    flight.started, flight.ended = 2, {0: None, 1: None}
    assert not flight.seeds_ended  # seed 2 is still to start
    flight.phase = Phase.BROKEN  # seed 1 broke: seed 2 never starts
    assert flight.seeds_ended
    flight.started = 3  # seed 2 had started before the break: it has to end first
    assert not flight.seeds_ended
    flight.ended[2] = None
    assert flight.seeds_ended


def test_the_seeds_of_a_configuration_follow_the_config_seed():
    assert seeds_of(7, 3) == [7, 8, 9]
