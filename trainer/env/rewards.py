"""Reward functions by name, several at once with weights, each scored on its own.

Every reward is called as fn(problem, completion, finished) -> float, where `finished` is True
when the completion ended with end-of-sequence. Built in (`REWARDS`):

  exact_match   the whole (trimmed) completion is the answer, before end-of-sequence
  last_number   the last number in the text equals the (numeric) answer, as graders read
                free text ("15 + 43 = 58", "The answer is 58.")
  boxed         the last \\boxed{...} holds the answer
  hash          the text after the last "####" (GSM8K's format) is the answer
  answer_tag    the last <answer>...</answer> holds the answer
  math_verify   Hugging Face's math-verify finds the answer mathematically equal
                (the optional extra: pip install ".[math]")
  format        1.0 when the completion finished with an answer in a \\boxed{}, "####" or
                <answer> tag, right or wrong: the shape only

A user's own function is a `{_target_: module.function}` entry; `{_target_: module.function,
style: trl}` is one written for TRL, fn(prompts=, completions=, completion_ids=, **columns) ->
list[float | None], called with what TRL would pass it for the task's data (`trl_kwargs`:
message lists for a conversational dataset, the row's other columns as keyword lists) on
either backend (trainer/env/trl_rewards.py). A `_target_` that is a class is built once with
the entry's other keys: a reward model, `{_target_: trainer.env.reward_model.RewardModel,
path: DIR}`, is one (TRL-style, scored in process). `RewardSet` holds the chosen ones with
their weights; the total is the weighted sum, and each reward is logged beside it
as `reward/<name>` (records/metrics.py).

The rewards that can hang (a user's, math_verify) are bounded by `task.reward_timeout` seconds a
call (trainer/env/reward_worker.py); the built-in regex ones run in process: they cannot hang.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from records import metrics as metrics_names
from records.errors import first_line
from trainer.base.errors import ConfigError
from trainer.env.trl_rewards import TrlStyleReward, trl_style

RewardFn = Callable[[Any, str, bool], float]  # (problem, completion, finished) -> reward

_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?|[-+]?\.\d+")
_BOXED = "\\boxed{"
_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class RewardError(RuntimeError):
    """A reward function raised or returned a non-number; the message names the reward."""


def parse_number(text: str) -> float | None:
    """The number a string holds ("1,234", "-3.5", " 7 "), else None."""
    cleaned = text.strip().replace(",", "").rstrip(".")
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def same_answer(found: str | None, answer: str) -> bool:
    """Numerically equal when both are numbers, else equal as trimmed text."""
    if found is None:
        return False
    a, b = parse_number(found), parse_number(answer)
    if a is not None and b is not None:
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return found.strip() == answer.strip()


def last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...}, nested braces included."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, begin = 1, start + len(_BOXED)
    for i in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[begin:i]
    return None


def after_hash(text: str) -> str | None:
    """The first line after the last "####" (GSM8K's answers), else None."""
    if "####" not in text:
        return None
    tail = text.rsplit("####", 1)[1].strip()
    return tail.splitlines()[0] if tail else None


def answer_tag(text: str) -> str | None:
    found = _TAG.findall(text)
    return found[-1] if found else None


def exact_match_reward(answer: str, completion: str, finished: bool) -> float:
    """1.0 for the whitespace-trimmed answer before end-of-sequence, else 0.0."""
    return float(finished and completion.strip() == answer.strip())


def _extracted(extract: Callable[[str], str | None]) -> RewardFn:
    def reward(problem, completion: str, finished: bool) -> float:
        return float(same_answer(extract(completion), problem.answer))

    return reward


def math_verify_reward(problem, completion: str, finished: bool) -> float:
    from math_verify import parse, verify  # the optional extra; `resolve` checked it is there

    # No timeouts: math-verify times out with signals, which only the main thread has (the
    # async pipeline scores in its sampler thread).
    gold = parse(problem.answer, parsing_timeout=None)
    found = parse(completion, parsing_timeout=None)
    return float(bool(gold) and bool(found) and verify(gold, found, timeout_seconds=None))


def format_reward(problem, completion: str, finished: bool) -> float:
    tagged = (last_boxed(completion), after_hash(completion), answer_tag(completion))
    return float(finished and any(found is not None for found in tagged))


REWARDS: dict[str, RewardFn] = {
    "exact_match": lambda problem, completion, finished: exact_match_reward(
        problem.answer, completion, finished
    ),
    "last_number": _extracted(last_number),
    "boxed": _extracted(last_boxed),
    "hash": _extracted(after_hash),
    "answer_tag": _extracted(answer_tag),
    "math_verify": math_verify_reward,
    "format": format_reward,
}
RESERVED_NAMES = ("mean", "std", "stderr", "timeouts")  # reward/mean etc. are taken
DEFAULT_TIMEOUT = 5.0  # task.reward_timeout when a task config leaves it out


def check_timeout(value: Any) -> float:
    """task.reward_timeout as seconds (0: no limit), or a one-line ConfigError."""
    if value is None:
        return DEFAULT_TIMEOUT
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ConfigError(
            f"task.reward_timeout={value!r}: must be a number of seconds >= 0 (0: no limit)"
        )
    return float(value)


def may_hang(entry: Any, fn: Any = None) -> bool:
    """A user's function or math_verify: bounded by the timeout in a worker process; not an
    object that runs in process (a reward model: a forward cannot hang, and a worker restarted
    after a timeout would load it again)."""
    if getattr(getattr(fn, "fn", fn), "in_process", False):
        return False
    return entry == "math_verify" or isinstance(entry, Mapping)


def resolve(entry: Any) -> tuple[str, RewardFn]:
    """A config entry (a name in REWARDS, or {_target_: module.function, name: optional}) as
    (metric name, function)."""
    if isinstance(entry, str):
        if entry not in REWARDS:
            raise ConfigError(f"task.rewards: unknown reward {entry!r}; one of {sorted(REWARDS)}")
        if entry == "math_verify":
            try:
                import math_verify  # noqa: F401
            except ImportError:
                raise ConfigError(
                    "task.rewards=math_verify: needs the math-verify package "
                    "(pip install '.[math]')"
                ) from None
        return entry, REWARDS[entry]
    if isinstance(entry, Mapping) and isinstance(entry.get("_target_"), str):
        from hydra.utils import get_method

        target = entry["_target_"]
        try:
            fn = get_method(target)
        except Exception as e:
            cause = e.__cause__ or e  # Hydra's wrapper spans lines; its cause is the one line
            raise ConfigError(
                f"task.rewards: cannot import _target_={target!r} "
                f"({type(cause).__name__}: {first_line(cause)})"
            ) from None
        if isinstance(fn, type):  # a class (a reward model): built once with the entry's keys
            fn = _build(target, fn, entry)
        default = getattr(fn, "__name__", None) or target.rsplit(".", 1)[-1]
        return str(entry.get("name") or default), fn
    raise ConfigError(
        f"task.rewards: {entry!r} is neither a reward name ({sorted(REWARDS)}) "
        "nor {_target_: module.function}"
    )


ENTRY_KEYS = ("_target_", "name", "style")  # an entry's keys that are not a class's arguments


def _build(target: str, cls: type, entry: Mapping) -> Any:
    """A `_target_` class's instance, its other keys as keyword arguments."""
    kwargs = {k: v for k, v in entry.items() if k not in ENTRY_KEYS}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(
            f"task.rewards: cannot build _target_={target!r} with {kwargs} "
            f"({type(e).__name__}: {first_line(e)})"
        ) from None


class RewardSet:
    """The task's rewards with their weights: `parts` scores each, `total` sums them."""

    def __init__(self, rewards: list, weights: list | None = None) -> None:
        if not rewards:
            raise ConfigError("task.rewards=[]: needs at least one reward")
        resolved = [resolve(entry) for entry in rewards]
        self.names = [name for name, _ in resolved]
        self.fns = [
            TrlStyleReward(fn) if trl_style(entry, fn) else fn
            for (_, fn), entry in zip(resolved, rewards, strict=True)
        ]
        self.entries = dict(zip(self.names, rewards, strict=True))
        self.worker = None  # a RewardWorker once reward_worker.bound gives a timeout
        for name in self.names:
            if name in RESERVED_NAMES or self.names.count(name) > 1:
                raise ConfigError(
                    f"task.rewards: the name {name!r} is taken (twice, or one of "
                    f"{RESERVED_NAMES}); give the entry its own `name`"
                )
        weights = [1.0] * len(self.names) if weights is None else list(weights)
        if len(weights) != len(self.names):
            raise ConfigError(
                f"task.reward_weights={weights}: {len(weights)} weights for "
                f"{len(self.names)} rewards {self.names}"
            )
        for w in weights:
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
                raise ConfigError(f"task.reward_weights={weights}: each must be a finite number")
        self.weights = [float(w) for w in weights]

    def parts_batch(self, calls: list[tuple]) -> tuple[list[dict[str, float]], int | None]:
        """Each (problem, completion, finished) call's parts, and how many reward calls timed
        out (None without a worker: no limit). A worker's rewards go over in one batch."""
        if self.worker is None:
            return [self.parts(*call) for call in calls], None
        columns, timeouts = {}, 0
        for name, fn in zip(self.names, self.fns, strict=True):
            if hasattr(fn, "batch"):
                columns[name], timed_out = fn.batch(calls)
                timeouts += timed_out
            else:
                columns[name] = [call_reward(name, fn, *call) for call in calls]
        return [{name: columns[name][i] for name in self.names} for i in range(len(calls))], (
            timeouts
        )

    def parts(self, problem, completion: str, finished: bool) -> dict[str, float]:
        """Each reward's score, by name; a reward that raises or returns a non-number
        raises RewardError naming it."""
        return {
            name: call_reward(name, fn, problem, completion, finished)
            for name, fn in zip(self.names, self.fns, strict=True)
        }

    def total(self, parts: dict[str, float]) -> float:
        return sum(w * parts[name] for name, w in zip(self.names, self.weights, strict=True))

    def __call__(self, problem, completion: str, finished: bool) -> float:
        return self.total(self.parts(problem, completion, finished))


def shorten(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def raised(name: str, error: Exception, completion: str) -> str:
    """One line: which reward raised what, on which completion."""
    message = str(error).strip().splitlines()
    detail = f": {message[0]}" if message else ""
    return (
        f"reward {name!r} raised {type(error).__name__}{detail} "
        f"(on completion {shorten(completion)!r})"
    )


def check_number(name: str, value: Any, completion: str) -> float:
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RewardError(
            f"reward {name!r} returned {value!r} ({type(value).__name__}), not a finite number "
            f"(on completion {shorten(completion)!r})"
        )
    return float(value)


def call_reward(name: str, fn: RewardFn, problem, completion: str, finished: bool) -> float:
    """One reward on one completion: its number, or RewardError naming it (a reward that
    raises, or returns something other than a finite number)."""
    try:
        value = fn(problem, completion, finished)
    except (ConfigError, RewardError):  # RewardError: already named (a worker's reply)
        raise
    except Exception as e:
        raise RewardError(raised(name, e, completion)) from e
    return check_number(name, value, completion)


def score(task, problem, completion: str, finished: bool) -> tuple[float, dict[str, float]]:
    """(the total reward, each reward's own score by name): a task with a RewardSet (the
    built-in ones) reports each reward, any other task its `reward` alone."""
    rewards = getattr(task, "rewards", None)
    if isinstance(rewards, RewardSet):
        parts = rewards.parts(problem, completion, finished)
        return rewards.total(parts), parts
    name = f"{type(task).__name__}.reward"
    try:
        value = task.reward(problem, completion, finished)
    except (ConfigError, RewardError):
        raise
    except Exception as e:
        raise RewardError(raised(name, e, completion)) from e
    return check_number(name, value, completion), {}


def score_batch(task, calls: list[tuple]) -> tuple[list[tuple[float, dict]], int | None]:
    """`score` of each (problem, completion, finished) call, and how many reward calls timed
    out (None: the task's rewards have no time limit)."""
    rewards = getattr(task, "rewards", None)
    if not isinstance(rewards, RewardSet):
        return [score(task, *call) for call in calls], None
    parts, timeouts = rewards.parts_batch(calls)
    return [(rewards.total(p), p) for p in parts], timeouts


def reward_part_means(rollouts) -> dict[str, float]:
    """`reward/<name>`: each reward's mean over the rollouts that carry its score."""
    names = dict.fromkeys(name for r in rollouts for name in r.reward_parts)
    return {
        metrics_names.reward_part(name): sum(r.reward_parts[name] for r in rollouts) / len(rollouts)
        for name in names
    }
