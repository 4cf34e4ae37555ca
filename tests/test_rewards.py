"""Rewards: each built-in on hand-made completions with known scores, weights, a user's own
function, and the one-line errors."""

import pytest

from trainer.base.errors import ConfigError
from trainer.env.rewards import REWARDS, RewardError, RewardSet, score
from trainer.env.tasks import Problem

PROBLEM = Problem("What is 59 + 63?", "122")


@pytest.mark.parametrize(
    ("reward", "completion", "finished", "expected"),
    [
        ("exact_match", " 122\n", True, 1.0),
        ("exact_match", "122", False, 0.0),
        ("exact_match", "The answer is 122", True, 0.0),
        ("last_number", "59 + 63 = 122", True, 1.0),
        ("last_number", "The answer is 122.", True, 1.0),
        ("last_number", "The answer is 1,22", True, 1.0),  # thousands separators are dropped
        ("last_number", "122 is wrong, it is 121", True, 0.0),
        ("last_number", "59 + 63 = 122.0", False, 1.0),  # graders read the text, ended or not
        ("last_number", "no number here", True, 0.0),
        ("boxed", "so \\boxed{122} it is", True, 1.0),
        ("boxed", "\\boxed{121} then \\boxed{122}", True, 1.0),
        ("boxed", "\\boxed{12", True, 0.0),
        ("boxed", "122", True, 0.0),
        ("hash", "59 + 63 = 122\n#### 122", True, 1.0),
        ("hash", "#### 121\nmore text", True, 0.0),
        ("hash", "####", True, 0.0),
        ("answer_tag", "<think>59+63</think><answer> 122 </answer>", True, 1.0),
        ("answer_tag", "<answer>121</answer>", True, 0.0),
        ("format", "<answer>121</answer>", True, 1.0),  # the shape only, not the value
        ("format", "\\boxed{x}", True, 1.0),
        ("format", "#### 122", False, 0.0),  # cut off: not the format's end
        ("format", "The answer is 122", True, 0.0),
    ],
)
def test_each_reward_scores_hand_made_completions(reward, completion, finished, expected):
    assert REWARDS[reward](PROBLEM, completion, finished) == expected


def test_math_verify_checks_equivalence():
    pytest.importorskip("math_verify")
    half = Problem("What is 1/2?", "\\frac{1}{2}")
    assert REWARDS["math_verify"](half, "The answer is $0.5$", True) == 1.0
    assert REWARDS["math_verify"](half, "It is $\\boxed{\\frac{2}{4}}$", True) == 1.0
    assert REWARDS["math_verify"](half, "It is $\\frac{1}{3}$", True) == 0.0


def test_weighted_rewards_report_each_part_and_the_weighted_total():
    rewards = RewardSet(["last_number", "format"], [1.0, 0.1])
    parts = rewards.parts(PROBLEM, "59 + 63 = 122\n#### 122", True)
    assert parts == {"last_number": 1.0, "format": 1.0}
    assert rewards.total(parts) == pytest.approx(1.1)
    assert rewards(PROBLEM, "#### 121", True) == pytest.approx(0.1)


def test_a_users_own_reward_by_target():
    rewards = RewardSet(["exact_match", {"_target_": "user_rewards.shorter_is_better"}])
    assert rewards.names == ["exact_match", "shorter_is_better"]
    assert rewards.parts(PROBLEM, "122", True) == {"exact_match": 1.0, "shorter_is_better": 0.25}
    named = RewardSet([{"_target_": "user_rewards.shorter_is_better", "name": "brevity"}])
    assert named.names == ["brevity"]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("user_rewards.broken", "reward 'broken' raised KeyError: 'no_such_key' (on completion '122')"),
        ("user_rewards.not_a_number", "reward 'not_a_number' returned 'yes' (str), not a finite number"),
    ],
)  # fmt: skip
def test_a_reward_that_raises_or_returns_a_non_number_names_itself_in_one_line(entry, message):
    rewards = RewardSet([{"_target_": entry}])
    with pytest.raises(RewardError) as error:
        score(type("T", (), {"rewards": rewards})(), PROBLEM, "122", True)
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("rewards", "weights", "message"),
    [
        (["exact"], None, "task.rewards: unknown reward 'exact'; one of ['answer_tag', 'boxed',"),
        (["last_number", "format"], [1.0], "task.reward_weights=[1.0]: 1 weights for 2 rewards"),
        (["last_number"], ["high"], "task.reward_weights=['high']: each must be a finite number"),
        ([], None, "task.rewards=[]: needs at least one reward"),
        (["format", "format"], None, "task.rewards: the name 'format' is taken"),
        ([{"_target_": "user_rewards.nothing"}], None, "task.rewards: cannot import _target_='user_rewards.nothing'"),
    ],
)  # fmt: skip
def test_bad_reward_settings_are_one_line_config_errors(rewards, weights, message):
    with pytest.raises(ConfigError) as error:
        RewardSet(rewards, weights)
    assert str(error.value).startswith(message)


# --- TRL-style rewards (style: trl): called with what TRL passes for the data's format --------

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3="}]


def test_trl_kwargs_are_message_lists_for_a_conversational_row():
    from trainer.env.trl_rewards import trl_kwargs

    rows = [Problem(CHAT, "5", columns={"solution": "5", "level": 1}), Problem(CHAT, "5")]
    got = trl_kwargs(rows, ["5", ""], [[20], []])
    assert got["prompts"] == [CHAT, CHAT]
    assert got["completions"] == [
        [{"role": "assistant", "content": "5"}],
        [{"role": "assistant", "content": ""}],
    ]
    assert got["completion_ids"] == [[20], []]
    # every row's columns as lists, a row without one gets None (as a dataset's missing cell)
    assert got["solution"] == ["5", None] and got["level"] == [1, None]
    assert got["answer"] == ["5", "5"]


def test_trl_kwargs_are_strings_for_a_standard_row():
    from trainer.env.trl_rewards import trl_kwargs

    got = trl_kwargs([PROBLEM], ["122"], [[]])
    assert got["prompts"] == [PROBLEM.prompt] and got["completions"] == ["122"]


def test_a_trl_docs_reward_scores_under_our_reward_set():
    """`style: trl` on either backend: TRL's documentation's accuracy reward, reading
    completion[0]["content"] and the row's `solution`, scores our completions."""
    rewards = RewardSet([{"_target_": "user_rewards.accuracy_reward", "style": "trl"}])
    problem = Problem(CHAT, "5", columns={"solution": "5"})
    assert rewards.parts(problem, "it is 5", True) == {"accuracy_reward": 1.0}
    assert rewards.parts(problem, "it is 6", True) == {"accuracy_reward": 0.0}


def test_a_trl_reward_returning_two_values_for_one_is_named():
    rewards = RewardSet([{"_target_": "user_rewards.one_too_many", "style": "trl"}])
    with pytest.raises(RewardError, match=r"^reward 'one_too_many' raised ValueError: returned 2 "):
        rewards.parts(Problem(CHAT, "5"), "5", True)
