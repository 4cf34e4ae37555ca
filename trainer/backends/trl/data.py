"""Our task as TRL's training data: a dataset of our problems and reward_funcs with weights.

The dataset holds the problems in the order our trainer draws them (batch_size a step, from
`random.Random(seed)`), each `prompt` as the data wrote it: a string, or a list of messages
(TRL's conversational format, so TRL hands rewards completions as message lists). The token
ids are ours, rendered once (`TrainingData.prompt_ids`, by `prompt_key`): the trainer class
takes them from there instead of templating again. Columns: `prompt`, `answer`,
`problem_index` and, for a data file (task=jsonl), the row's other columns, which TRL passes
to every reward function as keyword lists.

Rewards: ours (by name or `{_target_: module.fn}`, called per completion as
fn(problem, completion, finished)) become one batched reward function each; a TRL-style one
(`style: trl`, trainer/env/trl_rewards.py) is called as TRL calls it, in training and, one
completion at a time, in our eval (where None scores 0). A reward that raises or returns a
non-number raises RewardError naming it, as on our backend.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from omegaconf import DictConfig

from trainer.env.prompts import PromptRenderer, prompt_key
from trainer.env.reward_model import RewardModel
from trainer.env.reward_worker import ChildReward
from trainer.env.rewards import (
    RewardError,
    RewardSet,
    call_reward,
    check_number,
    raised,
    score_batch,
)
from trainer.env.tasks import Problem, Task
from trainer.env.trl_rewards import TrlStyleReward, completion_text, reward_columns

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
    prompt_ids: dict[Any, list[int]]  # a prompt's `prompt_key` -> our token ids for it
    reward_funcs: list[Callable]
    reward_weights: list[float]
    timeouts: TimeoutCount | None = None  # None: no reward runs under a time limit
    reward_names: list[str] | None = None  # TRL's reward_func_names (a model's: its dir's name)


def training_data(
    cfg: DictConfig, task: Task, renderer: PromptRenderer, eos_ids: Sequence[int]
) -> TrainingData:
    """The dataset rows and reward functions of a run; `task` is make_task's."""
    rng = random.Random(cfg.seed)
    problems = [p for _ in range(cfg.max_steps) for p in task.train_problems(cfg.batch_size, rng)]
    ids = renderer.render_all([p.prompt for p in problems])
    rows = [
        {**reward_columns(p), "prompt": _plain(p.prompt), PROBLEM_INDEX: i}
        for i, p in enumerate(problems)
    ]
    prompt_ids = {prompt_key(p.prompt): row for p, row in zip(problems, ids, strict=True)}
    rewards = getattr(task, "rewards", None)
    if not isinstance(rewards, RewardSet):
        return TrainingData(
            rows, prompt_ids, [_ours("reward", None, task, problems, eos_ids, None)], [1.0]
        )
    count = None if rewards.worker is None else TimeoutCount()
    funcs = []
    for name, fn in zip(rewards.names, rewards.fns, strict=True):
        if isinstance(fn, TrlStyleReward) and isinstance(fn.fn, RewardModel):
            funcs.append(trl_reward_model(fn.fn))
        elif isinstance(fn, TrlStyleReward):
            funcs.append(_checked_trl(name, fn.fn, count))
        else:
            funcs.append(_ours(name, fn, task, problems, eos_ids, count))
    return TrainingData(rows, prompt_ids, funcs, list(rewards.weights), count, rewards.names)


def trl_reward_model(reward: RewardModel) -> str:
    """A reward model as `trl grpo` hands it to GRPOTrainer: its directory, which TRL loads on
    the trainer's device (each rank's, prepared by accelerate) and scores in its own batched
    forward. RewardModel makes the same texts, padding and forward (tests/test_reward_model.py
    checks it against TRL's `_calculate_rewards`), so the objective, our evaluator calling
    RewardModel, reads the reward TRL trains on; handing TRL our CPU copy instead would score
    every training batch on the CPU. TRL loads it float32 (no model_init_kwargs: backend=trl
    trains float32, as `trl grpo` loads it with the recipe's dtype), as RewardModel does; its
    chat template gets GRPOConfig's chat_template_kwargs, which checks.validate checks are
    RewardModel's."""
    return reward.path


def _plain(prompt: Any) -> Any:
    """A prompt as the dataset holds it: messages as plain dicts (arrow stores them)."""
    return prompt if isinstance(prompt, str) else [dict(m) for m in prompt]


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
            (problems[index], completion_text(text), bool(ids) and ids[-1] in eos_ids)
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
            raise RewardError(raised(name, e, completion_text(completions[0]))) from e
        if len(values) != len(completions):
            raise RewardError(
                f"reward {name!r} returned {len(values)} values for {len(completions)} completions"
            )
        for value, text in zip(values, completions, strict=True):
            if value is not None:
                check_number(name, value, completion_text(text))
        return values

    reward.__name__ = name
    return reward
