"""Each reward called once before any trial, on a few real rows, so a reward that cannot score
fails the sweep in one line instead of failing every trial minutes in.

The completions are of the shape the run will hand the reward (trainer/env/trl_rewards.py's
`trl_kwargs` for a TRL-style one: message lists for a conversational dataset): each row's
reference answer, and an empty string, the two a reward meets first (a right answer, a model
that ends at once). A TRL-style reward is called once with all of them, as TRL batches, and
must return one number (or None) a completion; ours is called on each.
"""

from __future__ import annotations

import math
import random
from typing import Any

from trainer.base.errors import ConfigError
from trainer.env.rewards import RewardError, RewardSet, call_reward, shorten
from trainer.env.trl_rewards import TrlStyleReward, trl_kwargs

ROWS = 2  # eval rows each reward is called on


def check_rewards(task) -> None:
    """Call each of the task's rewards on ROWS of its rows; ConfigError (one line) naming the
    reward, the row and the error for one that raises, returns the wrong number of values
    or something other than a number."""
    rewards = getattr(task, "rewards", None)
    if not isinstance(rewards, RewardSet):
        return
    problems = (task.eval_problems() or task.train_problems(ROWS, random.Random(0)))[:ROWS]
    try:
        for name, fn in zip(rewards.names, rewards.fns, strict=True):
            if isinstance(fn, TrlStyleReward):
                _check_trl(name, fn, problems)
            else:
                _check_ours(name, fn, problems)
    finally:
        if rewards.worker is not None:
            rewards.worker.close()


def _calls(problems: list) -> list[tuple[Any, str]]:
    return [(p, completion) for p in problems for completion in (p.answer, "")]


def _row(problem) -> str:
    prompt = problem.prompt if isinstance(problem.prompt, str) else problem.prompt[-1]["content"]
    return f"the row with prompt {shorten(prompt, 40)!r}"


def _refuse(name: str, problem, completion: str, error: str) -> ConfigError:
    return ConfigError(
        f"task.rewards: reward {name!r} fails before any trial, on {_row(problem)} and the "
        f"completion {shorten(completion, 30)!r}: {error}"
    )


def _check_ours(name: str, fn, problems: list) -> None:
    for problem, completion in _calls(problems):
        try:
            call_reward(name, fn, problem, completion, True)
        except RewardError as e:
            raise _refuse(name, problem, completion, _reason(name, e)) from None


def _check_trl(name: str, fn: TrlStyleReward, problems: list) -> None:
    calls = _calls(problems)
    rows = [problem for problem, _ in calls]
    completions = [completion for _, completion in calls]
    try:
        values = list(fn.fn(**trl_kwargs(rows, completions, [[] for _ in calls])))
    except RewardError as e:  # named by the worker process
        raise _refuse(name, rows[0], completions[0], _reason(name, e)) from None
    except ConfigError:  # a setting that names itself (a reward model that does not load)
        raise
    except Exception as e:
        raise _refuse(
            name, rows[0], completions[0], f"raised {type(e).__name__}: {_first(e)}"
        ) from None
    if len(values) != len(calls):
        raise _refuse(
            name, rows[0], completions[0],
            f"returned {len(values)} values for {len(calls)} completions",
        )  # fmt: skip
    for (problem, completion), value in zip(calls, values, strict=True):
        if value is None:
            continue  # TRL's "no score"
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise _refuse(
                name, problem, completion,
                f"returned {value!r} ({type(value).__name__}), not a finite number or None",
            )  # fmt: skip


def _first(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""


def _reason(name: str, error: RewardError) -> str:
    """A RewardError's line without its own naming ("reward 'x' raised ..."): ours names it."""
    text = _first(error)
    prefix = f"reward {name!r} "
    text = text.removeprefix(prefix)
    return text.split(" (on completion ")[0]


def check_task_rewards(task_cfg, checked: set[str]) -> None:
    """`check_rewards` on the task a config builds, once per distinct task config (`checked`
    holds the ones done: a sweep composes many configurations, mostly of one task)."""
    from omegaconf import OmegaConf

    from trainer.env.tasks import make_task

    key = OmegaConf.to_yaml(task_cfg, resolve=True)
    if key in checked:
        return
    checked.add(key)
    check_rewards(make_task(task_cfg))
