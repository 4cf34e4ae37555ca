"""Each reward is called once before any trial on real rows (trainer/env/reward_check.py): one
that raises, returns the wrong number of values or a non-number is refused in one line naming
it, the row and the error, and the sweep creates nothing."""

from __future__ import annotations

import re

import pytest
from conftest import run_sweep, sweep_env
from test_trl_formats import TESTS, conversational_rows, write_jsonl

from trainer.base.errors import ConfigError
from trainer.env.reward_check import check_rewards
from trainer.env.tasks import Problem, SplitTask

CHAT = conversational_rows(2)


def chat_task(*rewards) -> SplitTask:
    problems = [Problem(r["prompt"], str(r["solution"]), r) for r in CHAT]
    return SplitTask(problems, problems, list(rewards))


def test_good_rewards_of_both_styles_pass():
    check_rewards(
        chat_task("last_number", {"_target_": "user_rewards.accuracy_reward", "style": "trl"})
    )


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        ("user_rewards.broken", "raised KeyError: 'no_such_key'"),
        ("user_rewards.not_a_number", "returned 'yes' (str), not a finite number"),
    ],
)
def test_one_of_ours_that_cannot_score_is_refused(entry, error):
    with pytest.raises(ConfigError) as refused:
        check_rewards(chat_task({"_target_": entry}))
    name = entry.split(".")[1]
    assert str(refused.value) == (
        f"task.rewards: reward {name!r} fails before any trial, on the row with prompt "
        f"'0+1=' and the completion '1': {error}"
    )


# (reward entry, the one line the user reads): through `python -m sweeper`, before any trial
ROW = r"on the row with prompt '\d+\+\d+=' and the completion '\d+': "
REFUSED = [
    (
        "{_target_:user_rewards.reads_text,style:trl}",
        r"error: task.rewards: reward 'reads_text' fails before any trial, "
        + ROW
        + r"raised AttributeError: 'list' object has no attribute 'strip' \(at lr=0.0001\)",
    ),
    (
        "{_target_:user_rewards.one_too_few,style:trl}",
        r"error: task.rewards: reward 'one_too_few' fails before any trial, "
        + ROW
        + r"returned 3 values for 4 completions \(at lr=0.0001\)",
    ),
    (
        "{_target_:user_rewards.no_such_reward,style:trl}",
        r"error: task.rewards: cannot import _target_='user_rewards.no_such_reward' "
        r"\(ModuleNotFoundError: .*\)",  # the same at every point: no "(at ...)"
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("entry", "line"), REFUSED)
def test_a_reward_that_cannot_score_is_refused_before_any_trial(tmp_path, entry, line):
    data = write_jsonl(tmp_path / "conv.jsonl", conversational_rows(4))
    env = sweep_env(tmp_path, store=False)
    env["PYTHONPATH"] = f"{TESTS}:{env.get('PYTHONPATH', '')}"
    done = run_sweep(
        tmp_path, "backend=trl", "task=jsonl", f"task.path={data}", "task.answer_field=solution",
        "task.eval_fraction=0.5", f"task.rewards=[{entry}]", "lr=1e-4,1e-3", env=env, timeout=180,
    )  # fmt: skip
    assert done.returncode == 1
    assert re.fullmatch(line, done.stderr.strip().splitlines()[-1]), done.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conv.jsonl"]  # nothing created
