"""Rewards written for TRL, called as ours: an entry `{_target_: module.fn, style: trl}` (or an
object whose `style` says so, a reward model) is fn(prompts=, completions=, completion_ids=,
**columns) -> list[float | None]. `trl_kwargs` builds what TRL would pass it for the task's
data (message lists for a conversational dataset, the row's other columns as keyword lists),
and `TrlStyleReward` calls it one completion at a time, on either backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

STYLE_TRL = "trl"  # a task.rewards entry {_target_: module.fn, style: trl}: TRL's signature


def is_trl_style(entry: Any) -> bool:
    return isinstance(entry, Mapping) and entry.get("style") == STYLE_TRL


def completion_text(completion: Any) -> str:
    """A completion's text: TRL hands a conversational dataset's as [{"role": "assistant",
    "content": ...}]."""
    if isinstance(completion, str):
        return completion
    return "".join(str(message["content"]) for message in completion)


def reward_columns(problem) -> dict[str, Any]:
    """The row's columns a TRL-style reward gets as keywords: a data file's row (its prompt
    left out), with `answer` beside it, as the TRL backend's dataset holds it."""
    return {"answer": problem.answer, **getattr(problem, "columns", {})}


def trl_kwargs(problems: list, completions: list[str], completion_ids: list) -> dict[str, Any]:
    """What TRL passes a reward for these rows: each row's prompt as written (a string, or its
    messages for a conversational dataset), each completion in the same format (a string, or
    [{"role": "assistant", "content": text}]) and the rows' other columns as lists."""
    chat = [not isinstance(p.prompt, str) for p in problems]
    rows = [reward_columns(p) for p in problems]
    columns = {
        key: [row.get(key) for row in rows] for key in dict.fromkeys(k for r in rows for k in r)
    }
    return {
        **columns,
        "prompts": [
            p.prompt if not c else [dict(m) for m in p.prompt]
            for p, c in zip(problems, chat, strict=True)
        ],
        "completions": [
            [{"role": "assistant", "content": text}] if c else text
            for text, c in zip(completions, chat, strict=True)
        ],
        "completion_ids": completion_ids,
    }


class TrlStyleReward:
    """A TRL-style reward called as ours, one completion at a time (our backend's training,
    our evaluator). `fn` takes TRL's keyword lists; `tokenizer` (set once the run has one)
    gives the completion's ids, end-of-sequence appended when it finished."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self.tokenizer = None

    def ids(self, completion: str, finished: bool) -> list[int]:
        if self.tokenizer is None:
            return []
        ids = self.tokenizer(completion, add_special_tokens=False).input_ids
        eos = self.tokenizer.eos_token_id
        return ids + [eos] if finished and eos is not None else ids

    def __call__(self, problem, completion: str, finished: bool) -> float:
        values = list(
            self.fn(**trl_kwargs([problem], [completion], [self.ids(completion, finished)]))
        )
        if len(values) != 1:
            raise ValueError(f"returned {len(values)} values for 1 completion")
        return 0.0 if values[0] is None else values[0]  # None: no score (TRL's NaN), 0 here


def use_tokenizer(task, tokenizer) -> None:
    """Give the task's TRL-style rewards the run's tokenizer (their completion_ids)."""
    rewards = getattr(task, "rewards", None)
    for fn in getattr(rewards, "fns", ()):
        if isinstance(fn, TrlStyleReward):
            fn.tokenizer = tokenizer


def trl_style(entry: Any, fn: Any) -> bool:
    """An entry with `style: trl`, or an object that says it takes TRL's lists (a reward
    model: trainer/env/reward_model.py)."""
    return is_trl_style(entry) or getattr(fn, "style", None) == STYLE_TRL
