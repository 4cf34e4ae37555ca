"""Verdict arithmetic on hand-computed numbers, and the verdicts a researcher reads: a clear
win, a tie, one seed (the eval's noise only), a pruned seed, one configuration; and what to
run next when the study recorded a cause more seeds cannot fix."""

from __future__ import annotations

import math

import pytest

from analysis.verdict import Config, Seed, interval_cells, objective_range, summarize, verdict
from judge import blocked, stats


def test_t_interval_over_three_seeds():
    # mean 2, sd 1, se 1/sqrt(3) = 0.57735; t(0.975, df=2) = 4.302653 -> half 2.484138
    i = stats.t_interval([1.0, 2.0, 3.0])
    assert (i.estimate, i.low, i.high) == pytest.approx((2.0, -0.484138, 4.484138), abs=1e-6)
    assert i.method == "t over 3 seeds"


def test_normal_interval_from_the_eval_stderr():
    # 0.3 +- 1.959964 x 0.023 = 0.3 +- 0.045079
    i = stats.normal_interval(0.3, 0.023)
    assert (i.low, i.high) == pytest.approx((0.254921, 0.345079), abs=1e-6)
    assert not stats.normal_interval(0.3, None).known


def test_welch_difference():
    # means 2 and 4; se^2 = 1/3 and 4/3; se = sqrt(5/3) = 1.290994
    # df = (5/3)^2 / ((1/3)^2/2 + (4/3)^2/2) = 50/17 = 2.941176
    i = stats.welch_difference([1.0, 2.0, 3.0], [2.0, 4.0, 6.0])
    half = stats.t_quantile(50 / 17) * math.sqrt(5 / 3)
    assert i.estimate == -2.0 and (i.low, i.high) == pytest.approx((-2 - half, -2 + half))
    assert 3.1 < stats.t_quantile(50 / 17) < 3.25


def test_paired_difference_on_the_same_problems():
    # d = [1, 0, 0, 1]: mean 0.5, sd sqrt(1/3) = 0.577350, se 0.288675; t(0.975, 3) = 3.182446
    # half = 3.182446 x 0.288675 = 0.918693
    i = stats.paired_difference([1, 0, 1, 1], [0, 0, 1, 0])
    assert (i.estimate, i.low, i.high) == pytest.approx((0.5, -0.418693, 1.418693), abs=1e-5)
    assert i.method == "paired over 4 problems"


def test_unpaired_difference_from_two_stderrs():
    # 0.3 - 0.25 = 0.05; se = hypot(0.02, 0.015) = 0.025; half = 1.959964 x 0.025 = 0.048999
    i = stats.unpaired_difference(0.3, 0.02, 0.25, 0.015)
    assert (i.low, i.high) == pytest.approx((0.001001, 0.098999), abs=1e-6)


def one_seed(label: str, per_problem: list[float], **params) -> Config:
    mean = sum(per_problem) / len(per_problem)
    se = math.sqrt(sum((r - mean) ** 2 for r in per_problem) / (len(per_problem) - 1))
    se /= math.sqrt(len(per_problem))
    return Config(label, params, (Seed(0, mean, se, tuple(per_problem)),))


def test_a_clear_win_is_called_with_its_paired_interval():
    good = one_seed("t1", [1.0] * 30 + [0.0] * 10, lr=2e-3)
    bad = one_seed("t0", [1.0] * 10 + [0.0] * 30, lr=1e-2)
    v = verdict([bad, good])
    assert v.best.label == "t1" and v.runner_up_difference.excludes_zero
    assert v.decision.startswith("t1 (lr=0.002) beat every other, t0 by 0.5 (95% CI")
    assert "Best: t1 (lr=0.002) 0.75, 95% CI" in v.text and "paired over 40 problems" in v.text
    assert "eval's noise only" in v.text


def test_configurations_that_differ_by_noise_are_a_tie():
    # 56 problems: 40 could not tell apart 0.2 (0.22+), and the verdict would name that instead
    rewards = [1, 0, 1, 0, 1, 1, 0, 0] * 7
    flipped = list(rewards)
    for i in (3, 7, 11):  # three problems turn right, two turn wrong: noise, net +1 of 56
        flipped[i] = 1
    for i in (0, 4):
        flipped[i] = 0
    a, b = one_seed("t0", rewards), one_seed("t1", flipped)
    v = verdict([a, b])
    assert not v.runner_up_difference.excludes_zero
    assert v.decision.startswith("Tied at this sample size: t1 and t0")
    assert "more seeds would tell" in v.decision


def test_seeds_give_a_t_interval_and_a_pruned_seed_is_left_out():
    three = Config("t0", {}, tuple(Seed(s, v, 0.02) for s, v in enumerate([0.30, 0.32, 0.34])))
    s = summarize(three)
    assert s.interval.method == "t over 3 seeds" and s.mean == pytest.approx(0.32)
    assert interval_cells(s)[:2] == ["3", "0.32"]
    pruned = Config("t1", {}, (Seed(0, 0.5, 0.02), Seed(1, None, None), Seed(2, 0.52, 0.02)))
    assert summarize(pruned).interval.method == "t over 2 seeds"
    v = verdict([three, pruned])  # seeds 0 and 2 shared, but on 1 degree of freedom
    assert "unpaired, Welch t over seeds: too few seeds to pair" in v.text


def test_a_raced_sweeps_interval_uses_the_seed_variance_its_comparisons_use():
    """Raced (max_seeds set), a 2-seed configuration's interval is on the variance pooled over
    every configuration, as the race judges it, not its own 1 df (t = 12.7). By hand, without
    the upper-bound raise: mean 0.31, se sqrt(0.0004 / 2) = 0.014142, t(4) 2.7764: +-0.039265."""
    i = stats.pooled_mean([0.30, 0.32], stats.Pooled(0.0004, 4, 3))
    assert (i.estimate, i.low, i.high, i.df) == pytest.approx((0.31, 0.270735, 0.349265, 4))
    configs = [
        Config(f"t{k}", {}, tuple(Seed(s, v, 0.02) for s, v in enumerate(values)))
        for k, values in enumerate([(0.30, 0.32), (0.28, 0.31), (0.33, 0.34)])
    ]
    raced = verdict(configs, max_seeds=3).ranked
    assert all(
        s.interval.method.startswith("pooled t over seeds (3 configurations, df 3") for s in raced
    )
    own = stats.t_interval([0.30, 0.32])
    t0 = next(s for s in raced if s.label == "t0")
    assert t0.interval.high - t0.interval.low < (own.high - own.low) / 2
    assert verdict(configs).ranked[0].interval.method == "t over 2 seeds"  # fixed seeds


def test_one_configuration_has_no_runner_up_and_minimizing_flips_the_sign():
    only = verdict([one_seed("t0", [1.0, 0.0, 1.0])])
    assert "nothing to compare it with" in only.text and only.runner_up_difference is None
    low = one_seed("t0", [0.0] * 40)
    high = one_seed("t1", [1.0] * 20 + [0.0] * 20)
    v = verdict([low, high], maximize=False)
    assert v.best.label == "t0" and v.runner_up_difference.estimate == pytest.approx(0.5)
    assert verdict([]).lines == ["No completed configuration yet: no verdict."]


def test_no_interval_is_unknown_not_a_tie_and_no_completed_seed_has_no_mean():
    best = Config("t0", {}, (Seed(0, 0.40, 0.02),))
    no_stderr = Config("t1", {}, (Seed(0, 0.39, None),))  # logged no eval stderr
    close = Config("t2", {}, (Seed(0, 0.39, 0.02),))
    v = verdict([best, no_stderr, close])
    assert v.tied_with_best == ["t2"]  # t1's difference has no interval: not called a tie
    empty = summarize(Config("t3", {}, (Seed(0, None, None),)))
    assert not empty.interval.known and empty.interval.method == "no completed seed"


def _seed_record(seed: int, state: str, value=None, reason="", baseline=0.2, steps=5):
    from records.sweep import Replicate

    return Replicate(seed, state, value, None, steps, baseline, reason, None)


def test_a_configurations_outcome_combines_its_seeds():
    from records.sweep import State
    from sweeper.sweep.tell import combine

    both = combine(
        [_seed_record(0, State.COMPLETE, 0.4), _seed_record(1, State.COMPLETE, 0.6, baseline=0.3)],
        expected=2,
    )
    assert (both.state, both.value, both.steps_run) == (State.COMPLETE, 0.5, 10)
    assert both.baseline == pytest.approx(0.25)
    # one pruned seed prunes the configuration, with that seed's reason
    pruned = combine(
        [_seed_record(0, State.COMPLETE, 0.4), _seed_record(1, State.PRUNED, reason="kl")], 2
    )
    assert (pruned.state, pruned.value, pruned.reason) == (State.PRUNED, None, "seed 1: kl")
    # a seed that failed, or one that never reported, fails it and says how many
    failed = combine([_seed_record(0, State.FAIL, reason="boom")], 2)
    assert failed.reason == "1 of 2 seeds failed; seed 0: boom"
    short = combine([_seed_record(0, State.COMPLETE, 0.4)], 2)
    assert (short.state, short.reason) == (State.FAIL, "1 of 2 seeds ended without an objective")
    assert combine([_seed_record(0, State.FAIL, reason="boom")], 1).reason == "boom"


def _seeds(label: str, values: list[float], first: int = 0, stderr=None, baseline=None, **params):
    seeds = tuple(Seed(first + i, v, stderr) for i, v in enumerate(values))
    return Config(label, params, seeds, baseline)


def test_a_verdict_paired_by_seed_where_seeds_are_shared():
    # d = a - b per seed = [0.05, 0.07, 0.05]: mean 0.056667, sd 0.011547, se 0.0066667;
    # two configurations: the blocked fit is the per-seed difference, df (2-1)(3-1) = 2;
    # its variance s^2 = var(d) / 2 = 6.6667e-5 raised to the 60% upper bound, x 2 / chi2(0.40,
    # 2) = 1.957616 -> 1.30508e-4, se 0.0066667 x 1.399148 = 0.0093277; moderated toward the
    # pair's own var(d) / 2 (here the unraised s^2): (2 x 1.30508e-4 + 2 x 6.6667e-5) / 4 =
    # 9.85875e-5, se 0.0093277 x sqrt(0.985875 / 1.30508) = 0.0081071 on df 2 + 2 = 4:
    # t(0.975, 4) = 2.776445 -> half 0.022509
    a = _seeds("t0", [0.30, 0.40, 0.50])
    b = _seeds("t1", [0.25, 0.33, 0.45])
    v = verdict([a, b])
    d = v.runner_up_difference
    assert (d.estimate, d.low, d.high) == pytest.approx((0.056667, 0.034158, 0.079176), abs=1e-5)
    assert d.method == (
        "paired by seed (seed as block over 2 configurations, df 2, variance at its 60% upper "
        "bound), moderated by the pair's own 3 seeds (df 4)"
    )
    assert v.decision.startswith("t0 (defaults) beat every other, t1 by 0.0567")
    per_seed = blocked.per_seed_difference(a.by_seed, b.by_seed)  # the same, not raised
    assert (per_seed.low, per_seed.high) == pytest.approx((0.027983, 0.085351), abs=1e-5)


def test_an_unpaired_verdict_where_seeds_are_not_shared():
    # the same values on seeds 10-12 for t1: Welch's t. se^2 = 0.01/3 and 0.0101333/3,
    # se = 0.081921, df = 3.9998, t = 2.776 -> half 0.2274: 0.0567 is a tie
    a = _seeds("t0", [0.30, 0.40, 0.50])
    b = _seeds("t1", [0.25, 0.33, 0.45], first=10)
    v = verdict([a, b])
    d = v.runner_up_difference
    assert (d.low, d.high) == pytest.approx((-0.170768, 0.284101), abs=1e-4)
    assert d.method == "unpaired, Welch t over seeds: seeds not shared"
    assert v.decision.startswith("Tied at this sample size: t0 and t1")


def test_blocked_fit_over_three_configurations():
    # a = [1, 3], b = [0, 2], c = [1, 1] on seeds 0, 1: residuals x - row - column + grand
    # = (-1/3, 1/3, -1/3, 1/3, 2/3, -2/3), SS 4/3 on df (3-1)(2-1) = 2 -> s^2 2/3;
    # se(a - b) = sqrt(2 s^2 / 2) = 0.816497; t(0.975, 2) = 4.302653 -> half 3.513101
    fit = blocked.blocked_fit({"a": {0: 1, 1: 3}, "b": {0: 0, 1: 2}, "c": {0: 1, 1: 1}})
    assert (fit.df, fit.variance) == (2, pytest.approx(2 / 3))
    i = fit.difference("a", "b")
    assert (i.estimate, i.low, i.high) == pytest.approx((1, -2.513101, 4.513101), abs=1e-5)
    # b ran seed 0 only beside a's 0 and 1 (a raced configuration): read at the same seeds
    raced = blocked.blocked_fit({"a": {0: 1, 1: 3, 2: 2}, "b": {0: 0.5, 1: 2.5}})
    assert raced.adjusted == pytest.approx((2.0, 1.5))  # b at seed 2: 2 - 0.5
    assert blocked.blocked_fit({"a": {0: 1, 1: 2}, "b": {5: 1, 6: 2}}).difference("a", "b") is None


def test_the_pooled_variance_is_moderated_toward_the_pair_own():
    # The fit above: s^2 = 2/3 on df 2, se(a - b) = se(a - c) = 0.816497. a - b per seed is
    # [1, 1] (own variance 0), a - c is [0, 2] (own var(d) / 2 = 1). Moderated with PRIOR_DF 2:
    # a - b: (2 x 2/3 + 1 x 0) / 3 = 4/9 -> se 0.816497 x sqrt(2/3) = 0.666667;
    # a - c: (2 x 2/3 + 1 x 1) / 3 = 7/9 -> se 0.816497 x sqrt(7/6) = 0.881918;
    # t(0.975, 3) = 3.182446 -> halves 2.121632 and 2.806655: the steady pair narrows, the
    # scattered one widens (one pooled variance covered them 99% and 71-87%, bench/VERDICT.md)
    assert blocked.PRIOR_DF == 2
    fit = blocked.blocked_fit({"a": {0: 1, 1: 3}, "b": {0: 0, 1: 2}, "c": {0: 1, 1: 1}})
    steady = blocked.moderated(fit.difference("a", "b"), fit.variance, [1, 1])
    scattered = blocked.moderated(fit.difference("a", "c"), fit.variance, [0, 2])
    assert (steady.se, steady.df, steady.low, steady.high) == pytest.approx(
        (0.666667, 3, -1.121632, 3.121632), abs=1e-5
    )
    assert (scattered.se, scattered.low, scattered.high) == pytest.approx(
        (0.881918, -1.806655, 3.806655), abs=1e-5
    )
    assert scattered.method.endswith("moderated by the pair's own 2 seeds (df 3)")
    # one shared seed has no variance of its own: the fit's interval stands
    one = fit.difference("a", "b")
    assert blocked.moderated(one, fit.variance, [1]) == one


def test_a_mean_reward_interval_stays_in_zero_to_one():
    # [0.02, 0.10]: mean 0.06, se 0.04, t(0.975, 1) = 12.706205 -> -0.448248 to 0.568248
    c = _seeds("t0", [0.02, 0.10], stderr=0.02, baseline=0.05)
    assert objective_range("eval/reward/mean", [*c.values, c.baseline]) == (0.0, 1.0)
    assert objective_range("eval/reward/exact_match", c.values) == (0.0, 1.0)  # one reward's
    assert objective_range("eval/loss", c.values) is None
    assert objective_range("eval/reward/stderr", c.values) is None
    assert objective_range("eval/reward/mean", [1.5, 2.0]) is None
    i = summarize(c, (0.0, 1.0)).interval
    assert (i.low, i.high) == pytest.approx((0.0, 0.568248), abs=1e-6)
    assert i.method == "t over 2 seeds, clipped to [0, 1]"


def test_a_wide_interval_is_too_few_seeds_not_a_diagnosis():
    # [0.02, 0.10] around a 0.06 baseline reaches 0.568 - 0.06 = 0.508 above it
    v = verdict(
        [_seeds("t0", [0.02, 0.10], stderr=0.02, baseline=0.06, lr=3e-3)], True, None, (0, 1)
    )
    assert v.decision.startswith("Too few seeds to tell if training moved anything: t0's")
    assert "excludes its baseline, yet t0's reaches 0.508 above it" in v.text
    assert "may be far below" not in v.text and "Seeds will not help" not in v.text


def test_learned_nothing_only_when_no_interval_reaches_a_gain_over_the_eval_stderr():
    # [0.200, 0.202, 0.204]: mean 0.202, se 0.0011547, t(2) -> 0.197032 to 0.206968: at most
    # 0.006968 above its 0.2 baseline, under the eval's stderr 0.02: nothing learned
    flat = _seeds("t0", [0.200, 0.202, 0.204], stderr=0.02, baseline=0.2, lr=1e-3)
    v = verdict([flat])
    assert v.decision.startswith("Nothing learned: no configuration moved off its baseline")
    assert "lr (the largest tried here is 0.001) may be far below" in v.text
    # the same runs with an eval stderr of 0.005: 0.006968 could be a gain it sees
    sharp = _seeds("t0", [0.200, 0.202, 0.204], stderr=0.005, baseline=0.2, lr=1e-3)
    assert verdict([sharp]).decision.startswith("Too few seeds to tell")


def _study(tmp_path, values: dict[float, list[float]]):
    """A study of lr configurations in a log range 1e-4..1e-2, each with its seeds recorded
    as the sweeper records them."""
    import optuna
    from optuna.distributions import FloatDistribution

    from analysis.load import load_study
    from records.sweep import Replicate, StudyAttr, replicate_key

    tmp_path.mkdir()
    storage = f"sqlite:///{tmp_path / 'sweeps.db'}"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    study.set_user_attr(StudyAttr.OBJECTIVE, "eval/reward/mean")
    study.set_user_attr(StudyAttr.DIRECTION, "maximize")
    lr = FloatDistribution(1e-4, 1e-2, log=True)
    for x, seeds in values.items():
        attrs = {
            replicate_key(s): Replicate(s, "COMPLETE", v, 0.02, 4, 0.2, "", None).as_attr()
            for s, v in enumerate(seeds)
        }
        trial = optuna.trial.create_trial(
            params={"lr": x}, distributions={"lr": lr}, value=sum(seeds) / len(seeds),
            user_attrs=attrs,
        )  # fmt: skip
        study.add_trial(trial)
    return load_study(storage, "s", with_mlflow=False)


def test_no_extend_the_range_around_a_best_tied_with_every_other(tmp_path):
    from analysis.advice import edge_of_range

    # 0.31 vs 0.30 on 2 seeds each: a tie; the best sits at the top of the lr range
    tied = edge_of_range(_study(tmp_path / "a", {1e-4: [0.29, 0.31], 1e-2: [0.30, 0.32]}))
    assert [a.title for a in tied] == [
        "Run more seeds before moving the range (hydra.sweeper.seeds)"
    ]
    assert "tied with every other configuration at this sample size (t0)" in tied[0].why
    clear = edge_of_range(_study(tmp_path / "b", {1e-4: [0.10, 0.11], 1e-2: [0.50, 0.52]}))
    assert [a.title for a in clear] == ["Extend the range of lr upward"]


def test_mean_and_stderr_use_the_sample_sd():
    # [1, 0, 0, 1]: mean 0.5; sample variance (4 x 0.25) / 3 = 1/3; stderr sqrt(1/3 / 4) = sqrt(1/12)
    mean, stderr = stats.mean_and_stderr([1.0, 0.0, 0.0, 1.0])
    assert mean == 0.5 and stderr == pytest.approx((1 / 12) ** 0.5)
    assert stats.mean_and_stderr([1.0]) == (1.0, 0.0)  # one value: no spread to measure


def test_the_first_line_says_every_run_broke_when_no_configuration_completed():
    v = verdict([], True, 5, None, broken=4)
    assert v.decision.startswith("Every run broke: all 4 configurations were pruned or failed")
    assert v.next_step.startswith("Next: ")


def test_the_first_line_of_a_tie_says_tied_and_what_would_separate_them():
    configs = [
        Config("t0", {"lr": 1e-3}, tuple(Seed(s, v, None) for s, v in enumerate((0.30, 0.34)))),
        Config("t1", {"lr": 2e-3}, tuple(Seed(s, v, None) for s, v in enumerate((0.31, 0.33)))),
    ]
    v = verdict(configs, True, 5)
    assert v.decision.startswith("Tied at this sample size: ")
    assert "seeds each would separate" in v.decision or "means are equal" in v.decision
    assert v.next_step.startswith("Next: ") and len(v.decision) <= 120


def test_one_no_other_can_beat_by_min_difference_is_as_good_as_any_not_the_best():
    # t1's race stopped it: even its optimistic bound could not beat t0 by min_difference.
    # Their seed-paired difference holds zero, so the verdict names no winner, only that no
    # other configuration is worth more seeds against t0.
    from dataclasses import replace

    from judge.configs import config

    t0 = config("t0", (0.40, 0.44, 0.42), (0, 1, 2))
    t1 = replace(config("t1", (0.39, 0.43), (0, 1)), race="cannot beat t0 after 2 seeds: ...")
    v = verdict([t0, t1], True, 5)
    assert v.decision.startswith("t0 (defaults) is as good as any: no other can beat it by")
    assert "beat every other" not in v.decision and len(v.decision) <= 120
    assert v.next_step.startswith("Next: train with t0's settings")


# What to run next names the cause the study recorded before more seeds (analysis/next_step.py):
# hand-made trials, recorded as the sweeper records them, through the verdict the sweep prints.
NOISE = [1, 0, 1, 0, 1, 1, 0, 0] * 8  # 64 problems: enough to tell apart 0.2 (0.17+)
NOISE_FLIPPED = [1 - r if i in (3, 4) else r for i, r in enumerate(NOISE)]
NO_SIGNAL = (
    "no_learning_signal: groups/frac_zero_advantage=0.95 > 0.9 at step 5 (most groups score "
    "alike: raise group_size, or the task is too easy or too hard for this model)"
)


def _recorded(number: int, rewards: list[int], truncated=None, warnings=(), baseline=0.3, **more):
    """A completed one-seed trial: its seed's per-problem rewards, warnings and the baseline
    share cut at max_tokens, as the job records them (and `more` trial attrs)."""
    import optuna

    from records.sweep import Replicate, TrialAttr, replicate_key

    mean, stderr = stats.mean_and_stderr([float(r) for r in rewards])
    seed = Replicate(0, "COMPLETE", mean, stderr, 4, baseline, "", None,
                     per_problem=tuple(map(float, rewards)), warnings=tuple(warnings))  # fmt: skip
    attrs = {replicate_key(0): seed.as_attr(), TrialAttr.BASELINE: baseline}
    if truncated is not None:
        attrs[TrialAttr.BASELINE_TRUNCATED] = truncated
    attrs.update(more)
    trial = optuna.trial.create_trial(value=mean, user_attrs=attrs)
    trial.number = number
    return trial


def _judged(*trials, **study_attrs):
    from analysis.verdict import sweep_verdict

    return sweep_verdict(trials, {"objective": "eval/reward/mean", **study_attrs}, True, "s")


def _noise_pair(truncated: float, warnings: list[str]):
    """Two configurations that differ by noise, each with the same recorded evidence."""
    return _judged(
        _recorded(0, NOISE, truncated=truncated, warnings=warnings),
        _recorded(1, NOISE_FLIPPED, truncated=truncated, warnings=warnings),
    )


def test_every_baseline_completion_cut_at_max_tokens_says_raise_it_not_seeds():
    # no signal was recorded too (cut answers score alike): truncation, its cause, comes first
    v = _noise_pair(truncated=1.0, warnings=[NO_SIGNAL])
    assert v.decision.startswith("Tied at this sample size: t0 and t1")
    assert v.decision.endswith("; every baseline completion hit max_tokens.")
    assert v.next_step == (
        "Next: raise max_tokens (every baseline completion hit max_tokens); seeds will not help."
    )


def test_an_eval_too_small_names_the_eval_size_that_tells_not_seeds():
    # 4 problems: each interval reaches far above its baseline, too few seeds to tell...
    four = (_recorded(0, [1, 0, 1, 0], truncated=0.0), _recorded(1, [1, 1, 0, 1], truncated=0.0))
    v = _judged(*four)
    assert v.decision.startswith("Too few seeds to tell if training moved anything")
    # ...and yet no seed can: each scores the same 4 problems (the sweep's own warning's numbers)
    assert v.next_step == (
        "Next: task.eval_size=49 (4 eval problems tell apart only gaps of 0.69+, not 0.2); "
        "seeds will not help."
    )
    assert "more seeds" not in v.text
    # the study's min_difference is what counts, where it was set
    coarse = _judged(*four, min_difference=0.5)
    assert coarse.next_step.startswith("Next: task.eval_size=8 (4 eval problems tell apart")
    # a JSONL task holds out a share of its rows: it has no eval_size
    rows = ["task=jsonl", "task.path=qa.jsonl"]
    jsonl = _judged(_recorded(0, [1, 0, 1, 0], overrides=rows), _recorded(1, [1, 1, 0, 1]))
    assert jsonl.next_step.startswith("Next: task.eval_fraction for 49+ problems (4 eval")
    assert all(len(v.next_step) <= 120 for v in (v, coarse, jsonl))


def test_groups_that_all_scored_alike_say_no_learning_signal_not_seeds():
    v = _noise_pair(truncated=0.0, warnings=[NO_SIGNAL])
    assert v.decision.endswith("; groups scored alike: no learning signal.")
    assert v.next_step == (
        "Next: raise group_size, or change the task's difficulty (groups scored alike: no "
        "learning signal); seeds will not help."
    )


def test_more_seeds_when_no_recorded_cause_holds_for_every_tied_configuration():
    # half the baseline cut, a signal in t1's groups, 64 problems: seeds are what would tell
    entropy = "entropy_collapse: entropy=0.01 < 0.1 x its first at step 6 (lower lr)"
    v = _judged(
        _recorded(0, NOISE, truncated=0.5, warnings=[NO_SIGNAL]),
        _recorded(1, NOISE_FLIPPED, truncated=0.5, warnings=[entropy]),
    )
    assert v.decision.startswith("Tied at this sample size: t0 and t1")
    assert v.decision.endswith("; more seeds would tell.")
    assert v.next_step == (
        "Next: more seeds (hydra.sweeper.seeds=auto races them) or a larger eval (task.eval_size)."
    )
