"""Our task as TRL's training data: a dataset of our rendered prompts and reward_funcs with
weights.

The dataset holds the problems in the order our trainer draws them (batch_size a step, from
`random.Random(seed)`), each prompt as the text of our rendering with its token ids kept beside
it (`TrainingData.prompt_ids`), so TRL trains on the very ids our backend would (the trainer
class takes its prompt ids from there instead of tokenizing again). Columns: `prompt`,
`answer`, `problem_index` and, for a data file (task=jsonl), the row's other columns, which
TRL passes to every reward function as keyword lists.

Rewards: ours (by name or `{_target_: module.fn}`, called per completion as
fn(problem, completion, finished)) become one batched reward function each; a TRL-style one,
`{_target_: module.fn, style: trl}`, is called as TRL calls it,
fn(prompts=, completions=, completion_ids=, **columns) -> list[float | None], in training and,
one completion at a time, in our eval (where None scores 0). A reward that raises or returns a
non-number raises RewardError naming it, as on our backend.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from omegaconf import DictConfig

from trainer.backends.trl.mapping import trl_style_indices
from trainer.env.prompts import PromptRenderer, prompt_key
from trainer.env.reward_worker import ChildReward
from trainer.env.rewards import (
    RewardError,
    RewardSet,
    call_reward,
    check_number,
    raised,
    score_batch,
)
from trainer.env.tasks import Problem, Task, read_split

PROBLEM_INDEX = "problem_index"  # the dataset column that names a row's Problem


@dataclass
class TimeoutCount:
    """Training reward calls past task.reward_timeout since the last report: the callback
    reports them as reward/timeouts, as our backend does (this process's calls: rank 0's in a
    run of several)."""

    calls: int = 0

    def take(self) -> float:
        taken, self.calls = self.calls, 0
        return float(taken)


@dataclass
class TrainingData:
    rows: list[dict[str, Any]]  # the dataset's rows, in training order
    prompt_ids: dict[str, list[int]]  # a prompt's text -> our token ids for it
    reward_funcs: list[Callable]
    reward_weights: list[float]
    timeouts: TimeoutCount | None = None  # None: no reward runs under a time limit


def extra_columns(task_cfg: DictConfig) -> Callable[[Problem], dict[str, Any]]:
    """A problem's other columns in its data file (task=jsonl's rows), else none."""
    path, field = task_cfg.get("path"), task_cfg.get("prompt_field")
    if not isinstance(path, str) or not isinstance(field, str):
        return lambda problem: {}
    answer_field = task_cfg.get("answer_field", "answer")
    splits = {task_cfg.get("split", "train"), task_cfg.get("eval_split")} - {None}
    found: dict[tuple, dict[str, Any]] = {}
    for split in splits:
        for row in read_split(Path(path).expanduser(), split, "task.split"):
            key = (prompt_key(_messages(row[field])), str(row[answer_field]))
            found[key] = {k: v for k, v in row.items() if k not in (field, "prompt")}
    return lambda problem: found.get((prompt_key(problem.prompt), problem.answer), {})


def _messages(prompt: Any) -> Any:
    if isinstance(prompt, str):
        return prompt
    return [{"role": m["role"], "content": m["content"]} for m in prompt]


def training_data(
    cfg: DictConfig, task: Task, renderer: PromptRenderer, eos_ids: Sequence[int]
) -> TrainingData:
    """The dataset rows and reward functions of a run; `task` is `with_trl_rewards`'s."""
    rng = random.Random(cfg.seed)
    problems = [p for _ in range(cfg.max_steps) for p in task.train_problems(cfg.batch_size, rng)]
    ids = renderer.render_all([p.prompt for p in problems])
    texts = [renderer.tokenizer.decode(row) for row in ids]
    columns = extra_columns(cfg.task)
    rows = [
        {**columns(p), "prompt": text, "answer": p.answer, PROBLEM_INDEX: i}
        for i, (p, text) in enumerate(zip(problems, texts, strict=True))
    ]
    prompt_ids = dict(zip(texts, ids, strict=True))
    rewards = getattr(task, "rewards", None)
    if not isinstance(rewards, RewardSet):
        return TrainingData(
            rows, prompt_ids, [_ours("reward", None, task, problems, eos_ids, None)], [1.0]
        )
    count = None if rewards.worker is None else TimeoutCount()
    funcs = []
    for name, fn in zip(rewards.names, rewards.fns, strict=True):
        if isinstance(fn, TrlStyleReward):
            funcs.append(_checked_trl(name, fn.fn, count))
        else:
            funcs.append(_ours(name, fn, task, problems, eos_ids, count))
    return TrainingData(rows, prompt_ids, funcs, list(rewards.weights), count)


def _ours(
    name: str,
    fn,
    task: Task,
    problems: list[Problem],
    eos_ids: Sequence[int],
    count: TimeoutCount | None,
):
    """One of our rewards as TRL's batched reward function; fn None: the task's own reward."""

    def reward(prompts, completions, completion_ids, **columns) -> list[float]:
        calls = [
            (problems[index], text, bool(ids) and ids[-1] in eos_ids)
            for text, ids, index in zip(
                completions, completion_ids, columns[PROBLEM_INDEX], strict=True
            )
        ]
        if fn is None:
            return [total for total, _ in score_batch(task, calls)[0]]
        if hasattr(fn, "batch"):  # a reward in the worker process: one batch, time-limited
            values, timeouts = fn.batch(calls)
            count.calls += timeouts
            return values
        return [call_reward(name, fn, *call) for call in calls]

    reward.__name__ = name  # TRL logs rewards/<__name__>/mean
    return reward


# What TRL hands a reward that lives in its trainer's process (the trainer's logging methods,
# its environments): they cannot be sent to a reward in the worker process (task.reward_timeout).
TRAINER_ONLY = ("log_extra", "log_metric", "environments")


def _for_worker(columns: dict[str, Any]) -> dict[str, Any]:
    """TRL's keyword arguments as the worker process can take them: trainer_state as plain
    attributes, since unpickling a TrainerState imports transformers there (~10 s on a loaded
    2-core CPU: past the timeout)."""
    sent = {k: v for k, v in columns.items() if k not in TRAINER_ONLY}
    if "trainer_state" in sent:
        sent["trainer_state"] = SimpleNamespace(**dataclasses.asdict(sent["trainer_state"]))
    return sent


def _checked_trl(name: str, fn, count: TimeoutCount | None):
    """A TRL-style reward with our one-line errors; None (no score) passes as TRL reads it."""

    def call(**columns) -> list:
        if not isinstance(fn, ChildReward):
            return list(fn(**columns))
        values, timeouts = fn.trl_batch(_for_worker(columns))
        count.calls += timeouts
        return list(values)

    def reward(prompts, completions, completion_ids, **columns) -> list[float | None]:
        try:
            values = call(
                prompts=prompts, completions=completions, completion_ids=completion_ids, **columns
            )
        except RewardError:  # named already (by the worker process)
            raise
        except Exception as e:
            raise RewardError(raised(name, e, str(completions[0]))) from e
        for value, text in zip(values, completions, strict=False):
            if value is not None:
                check_number(name, value, str(text))
        return values

    reward.__name__ = name
    return reward


class TrlStyleReward:
    """A TRL-style reward called one completion at a time, as our evaluator scores."""

    def __init__(self, fn, columns: Callable[[Problem], dict], renderer: PromptRenderer, eos_id):
        self.fn, self.columns, self.renderer, self.eos_id = fn, columns, renderer, eos_id

    def __call__(self, problem: Problem, completion: str, finished: bool) -> float:
        tokenizer = self.renderer.tokenizer
        ids = tokenizer(completion, add_special_tokens=False).input_ids
        row = {**self.columns(problem), "answer": problem.answer}
        (value,) = self.fn(
            prompts=[tokenizer.decode(self.renderer(problem.prompt))],
            completions=[completion],
            completion_ids=[ids + [self.eos_id] if finished else ids],
            **{key: [value] for key, value in row.items()},
        )
        return 0.0 if value is None else value


def with_trl_rewards(task: Task, task_cfg: DictConfig, renderer: PromptRenderer) -> Task:
    """The task with its TRL-style rewards callable as ours (for our evaluator)."""
    rewards = getattr(task, "rewards", None)
    columns = extra_columns(task_cfg)
    for i in trl_style_indices(task_cfg):
        if isinstance(rewards, RewardSet) and not isinstance(rewards.fns[i], TrlStyleReward):
            eos = renderer.tokenizer.eos_token_id
            rewards.fns[i] = TrlStyleReward(rewards.fns[i], columns, renderer, eos)
    return task
