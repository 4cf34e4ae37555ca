"""Reward environments: problems with a prompt, a reference answer and a reward.

Any class with the `Task` methods works through `_target_` (`task._target_=my.module.MyTask`),
so a user brings their own data and reward function without touching the trainer.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from trainer.validation import ConfigError


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str


class Task(Protocol):
    def train_problems(self, n: int, rng: random.Random) -> list[Problem]:
        """n problems from the training split."""

    def eval_problems(self) -> list[Problem]:
        """The held-out split, the same every call."""

    def reward(self, problem: Problem, completion: str, finished: bool) -> float:
        """Score one completion; `finished` is True when it ended with end-of-sequence."""


def exact_match_reward(answer: str, completion: str, finished: bool) -> float:
    """1.0 for the whitespace-trimmed answer before end-of-sequence, else 0.0."""
    return float(finished and completion.strip() == answer.strip())


class SplitTask:
    """A fixed list of problems split once, by seed, into train and held-out eval."""

    def __init__(self, problems: list[Problem], eval_size: int, seed: int) -> None:
        order = list(range(len(problems)))
        random.Random(seed).shuffle(order)
        self._eval = [problems[i] for i in order[:eval_size]]
        self._train = [problems[i] for i in order[eval_size:]]

    def train_problems(self, n: int, rng: random.Random) -> list[Problem]:
        return (
            rng.sample(self._train, n) if n <= len(self._train) else rng.choices(self._train, k=n)
        )

    def eval_problems(self) -> list[Problem]:
        return list(self._eval)

    def reward(self, problem: Problem, completion: str, finished: bool) -> float:
        return exact_match_reward(problem.answer, completion, finished)


def addition_problem(a: int, b: int, num_digits: int) -> Problem:
    # Zero-padded operands put each digit at a fixed position: a ~300k-parameter model
    # learns the task in seconds this way, and in minutes without it.
    return Problem(prompt=f"{a:0{num_digits}d}+{b:0{num_digits}d}=", answer=str(a + b))


class AdditionTask(SplitTask):
    """Every `07+45=` with operands below 10**num_digits; the reward is exact match."""

    def __init__(self, num_digits: int = 2, eval_size: int = 200, seed: int = 0) -> None:
        if num_digits < 1:
            raise ConfigError(f"task.num_digits={num_digits!r}: must be >= 1")
        limit = 10**num_digits
        if not 1 <= eval_size < limit * limit:
            raise ConfigError(f"task.eval_size={eval_size!r}: must be in [1, {limit * limit})")
        problems = [addition_problem(a, b, num_digits) for a in range(limit) for b in range(limit)]
        super().__init__(problems, eval_size, seed)


def read_jsonl_problems(path: str | Path) -> list[Problem]:
    """Rows {"prompt": str, "answer": str}; a malformed row names its line number."""
    problems = []
    with Path(path).expanduser().open(encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(
                    f"task.path={str(path)!r}: line {line_number} is not JSON ({e.msg})"
                ) from None
            if not (
                isinstance(row, dict) and isinstance(row.get("prompt"), str) and "answer" in row
            ):
                raise ConfigError(
                    f"task.path={str(path)!r}: line {line_number} needs a string "
                    '"prompt" and an "answer"'
                )
            problems.append(Problem(prompt=row["prompt"], answer=str(row["answer"])))
    if len(problems) < 2:
        raise ConfigError(f"task.path={str(path)!r}: needs at least 2 rows (train and eval)")
    return problems


class JsonlTask(SplitTask):
    def __init__(self, path: str, eval_fraction: float = 0.1, seed: int = 0) -> None:
        if not 0 < eval_fraction < 1:
            raise ConfigError(f"task.eval_fraction={eval_fraction!r}: must be in (0, 1)")
        problems = read_jsonl_problems(path)
        eval_size = min(len(problems) - 1, max(1, round(eval_fraction * len(problems))))
        super().__init__(problems, eval_size, seed)
