"""train_reward_fell: the training reward, logged every step, read as windows' means, so a break
between two evals is seen (its row in docs/health.md's table)."""

from __future__ import annotations

import json

import pytest

from records import metrics
from trainer.run.health import (
    Check,
    HealthMonitor,
    HealthRule,
    default_rules,
    replay,
    warnings,
)
from trainer.run.health import rules_from_settings as from_settings

REWARD, EVAL, EVAL_SE = metrics.REWARD, metrics.EVAL_REWARD, metrics.stderr_of(metrics.EVAL_REWARD)


def rule(bound: float, window: int = 2) -> HealthRule:
    return HealthRule("fell", REWARD, Check.mean_below_start, bound, window=window, unit="stderr")


def first_firing(rules: list[HealthRule], rewards: list[float]) -> int | None:
    monitor = HealthMonitor(rules)
    monitor.breaches(0, {EVAL: 0.3, EVAL_SE: 0.05})
    for step, reward in enumerate(rewards, 1):
        if monitor.breaches(step, {REWARD: reward}):
            return step
    return None


def test_the_windows_compare_in_standard_errors_of_their_own_spread():
    """First window 0.4, 0.6: mean 0.5, sd 0.1414, standard error 0.1. Last window 0.1, 0.3:
    mean 0.2, standard error 0.1. The difference's is 0.1414: 0.3 / 0.1414 = 2.12 of them."""
    rewards = [0.4, 0.6, 0.1, 0.3]
    assert first_firing([rule(2.0)], rewards) == 4
    assert first_firing([rule(2.2)], rewards) is None
    assert first_firing([rule(2.0)], [0.4, 0.6, 0.6, 0.4]) is None  # no fall
    assert first_firing([rule(2.0, window=3)], rewards) is None  # 3 values: no window yet


# SmolLM2 lr=2e-3 seed 29 (bench/results/curves/smollm2-arithmetic-lr0.002-seed29.json): its
# held-out reward peaked at 0.80 at step 2 and broke; a sweep evaluating every 10 steps saw
# 0.28, 0.36, 0.31, 0.22 at steps 0, 10, 20, 30, and no eval or KL rule fired.
TRAIN = [0.53, 0.62, 0.53, 0.62, 0.56, 0.34, 0.25, 0.28, 0.44, 0.44, 0.28, 0.03, 0.03, 0.12]
TRAIN += [0.06, 0.09, 0.34, 0.16, 0.00, 0.16, 0.34, 0.12, 0.12, 0.12, 0.12, 0.00, 0.09, 0.12]
EVALS = {0: (0.28, 0.057), 10: (0.36, 0.060), 20: (0.31, 0.058), 28: (0.22, 0.052)}
KL = [0.4] * len(TRAIN)  # under the KL rule's bound: that rule reads nothing here


def seed_29() -> dict[int, dict[str, float]]:
    steps: dict[int, dict[str, float]] = {0: {}}
    for step, (reward, kl) in enumerate(zip(TRAIN, KL, strict=True), 1):
        steps[step] = {REWARD: reward, metrics.KL_PRE_POST_V2: kl}
    for step, (value, se) in EVALS.items():
        steps[step].update({EVAL: value, EVAL_SE: se})
    return steps


def test_a_break_between_evals_is_warned_where_the_eval_rules_see_nothing():
    steps = seed_29()
    before = [r for r in default_rules(0.01) if r.name != "train_reward_fell"]
    assert replay(before, steps) is None
    break_rules = {"eval_drop", "learned_then_dropped", "learned_then_broke", "eval_collapse"}
    assert not break_rules & {b.rule for b in warnings(before, steps)}
    fired = {b.rule: b for b in warnings(default_rules(0.01), steps)}
    breach = fired["train_reward_fell"]
    assert replay(default_rules(0.01), steps) is None  # it warns: the trial goes on
    # Steps 1-5 average 0.572 (standard error 0.020); steps 6-10 average 0.350 (0.040): 5.0
    # standard errors of the difference apart, more than 4. Steps 5-9 average 0.374 (0.057):
    # 3.3, not yet.
    assert breach.step == 10
    assert breach.value == pytest.approx(0.35, abs=1e-9)
    assert "reward/mean=0.35 over its last steps fell more than 4 standard errors" in str(breach)


def test_a_learner_whose_training_reward_climbs_is_never_warned():
    rising = [0.3 + 0.02 * s for s in range(30)]
    noisy = [v + (0.08 if s % 2 else -0.08) for s, v in enumerate(rising)]
    assert first_firing([default_rule()], noisy) is None


def default_rule() -> HealthRule:
    return next(r for r in default_rules(0.01) if r.name == "train_reward_fell")


def test_a_resumed_monitor_keeps_its_first_window_and_an_older_state_judges_none():
    steps = seed_29()
    straight = HealthMonitor([default_rule()])
    expected = {s: straight.breaches(s, steps[s]) for s in sorted(steps)}
    first = HealthMonitor([default_rule()])
    for s in range(7):
        first.breaches(s, steps[s])
    resumed = HealthMonitor([default_rule()])
    resumed.load_state(json.loads(json.dumps(first.state())))
    assert {s: resumed.breaches(s, steps[s]) for s in range(7, 29)} == {
        s: expected[s] for s in range(7, 29)
    }
    older = {k: v for k, v in first.state().items() if k != "starts"}  # saved before windows
    kept = HealthMonitor([default_rule()])
    kept.load_state(older)
    assert not any(kept.breaches(s, steps[s]) for s in range(7, 29))


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"window": 1}, r"health\[0\].window=1: must be an integer from 2 to 10"),
        ({"window": 11}, r"health\[0\].window=11: must be an integer from 2 to 10"),
        ({"unit": "absolute"}, r"health\[0\].unit='absolute': mean_below_start counts in stderr"),
    ],
)
def test_a_bad_window_setting_is_refused_in_one_line(given, message):
    item = {"name": "fell", "metric": REWARD, "check": "mean_below_start", "bound": 3, **given}
    with pytest.raises(ValueError, match=message):
        from_settings([item], 0.01)


def test_a_window_rule_from_settings_counts_in_standard_errors():
    (made,) = from_settings(
        [{"name": "fell", "metric": REWARD, "check": "mean_below_start", "window": 2}], 0.01
    )
    assert (made.unit.value, made.bound, made.window) == ("stderr", 0.0, 2)
