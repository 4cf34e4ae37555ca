"""Reward environments: problems with a prompt, a reference answer and a reward.

Any class with the `Task` methods works through `_target_` (`task._target_=my.module.MyTask`),
so a user brings their own data and reward function without touching the trainer. A prompt is
a string or a list of {"role", "content"} messages; how it becomes tokens (the chat template,
`task.chat_template` and `task.system_prompt`) is trainer/env/prompts.py's job, the same for every
task. The built-in tasks score with a `RewardSet` (trainer/env/rewards.py: rewards by name, with
weights, each logged on its own).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from trainer.base.errors import ConfigError
from trainer.env.prompts import PROMPT_DEFAULTS, Prompt, check_messages, is_prompt, prompt_settings
from trainer.env.reward_worker import bound
from trainer.env.rewards import RewardSet, check_timeout, exact_match_reward, parse_number

log = logging.getLogger(__name__)

__all__ = ["Problem", "Task", "exact_match_reward", "make_task"]

REWARD_TIMEOUT = "reward_timeout"  # seconds a reward call may take; the task class never sees it
AUTO = "auto"  # task.rewards for a data file: chosen from its answers (`default_rewards`)


@dataclass(frozen=True)
class Problem:
    prompt: Prompt  # a string, or a list of {"role", "content"} messages
    answer: str
    # A data file's row, its prompt left out (the answer column, `solution`, ...): what TRL
    # passes a reward as keyword lists. Not part of the problem's identity.
    columns: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)


class Task(Protocol):
    def train_problems(self, n: int, rng: random.Random) -> list[Problem]:
        """n problems from the training split."""

    def eval_problems(self) -> list[Problem]:
        """The held-out split, the same every call."""

    def reward(self, problem: Problem, completion: str, finished: bool) -> float:
        """Score one completion; `finished` is True when it ended with end-of-sequence."""


# Where the trainer's layering moved the built-in tasks: a config saved before it (a tuned
# file, an MLflow run's config.yaml) still names the old module, and keeps working.
MOVED_TASK_MODULES = {"trainer.tasks": "trainer.env.tasks"}


def current_target(target: str) -> str:
    """A task's `_target_`, with a module the layering moved replaced by its new place."""
    module, _, name = target.rpartition(".")
    if module not in MOVED_TASK_MODULES:
        return target
    moved = f"{MOVED_TASK_MODULES[module]}.{name}"
    log.warning("task._target_=%s: the class moved to %s; update the config", target, moved)
    return moved


def make_task(task_cfg) -> Task:
    """The configured task (Hydra `_target_`), the prompt rendering keys (PROMPT_DEFAULTS)
    left out: the sampler reads those. Its RewardSet's rewards that may hang are bounded by
    task.reward_timeout."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf, open_dict

    missing = sorted(OmegaConf.missing_keys(task_cfg))
    if missing:
        raise ConfigError(f"{missing[0]}=???: must be given ({missing[0]}=...)")
    prompt_settings(task_cfg)  # checked here too, so a bad one fails before a model loads
    cfg = OmegaConf.create(OmegaConf.to_container(task_cfg, resolve=True))
    with open_dict(cfg):
        for key in PROMPT_DEFAULTS:
            cfg.pop(key, None)
        timeout = check_timeout(cfg.pop(REWARD_TIMEOUT, None))
        if isinstance(cfg.get("_target_"), str):
            cfg._target_ = current_target(cfg._target_)
    # Not recursive: a `{_target_: ...}` entry of task.rewards names a reward function to call
    # later, not an object to build now.
    task = instantiate(cfg, _recursive_=False, _convert_="all")
    if isinstance(getattr(task, "rewards", None), RewardSet):
        bound(task.rewards, timeout)
    return task


def split_once(problems: list[Problem], eval_size: int, seed: int) -> tuple[list, list]:
    """(train, eval): eval_size problems held out, chosen once by seed."""
    order = list(range(len(problems)))
    random.Random(seed).shuffle(order)
    return [problems[i] for i in order[eval_size:]], [problems[i] for i in order[:eval_size]]


class SplitTask:
    """Fixed train and held-out eval problems, scored by a RewardSet."""

    def __init__(
        self, train: list[Problem], eval: list[Problem], rewards: list, reward_weights=None
    ) -> None:
        self._train, self._eval = train, eval
        self.rewards = RewardSet(rewards, reward_weights)

    def train_problems(self, n: int, rng: random.Random) -> list[Problem]:
        return (
            rng.sample(self._train, n) if n <= len(self._train) else rng.choices(self._train, k=n)
        )

    def eval_problems(self) -> list[Problem]:
        return list(self._eval)

    def reward(self, problem: Problem, completion: str, finished: bool) -> float:
        return self.rewards(problem, completion, finished)


def addition_problem(a: int, b: int, num_digits: int) -> Problem:
    # Zero-padded operands put each digit at a fixed position: a ~300k-parameter model
    # learns the task in seconds this way, and in minutes without it.
    return Problem(prompt=f"{a:0{num_digits}d}+{b:0{num_digits}d}=", answer=str(a + b))


class AdditionTask(SplitTask):
    """Every `07+45=` with operands below 10**num_digits: the tiny model's task."""

    def __init__(
        self,
        num_digits: int = 2,
        eval_size: int = 400,
        seed: int = 0,
        rewards: Sequence = ("exact_match",),
        reward_weights: list | None = None,
    ) -> None:
        if num_digits < 1:
            raise ConfigError(f"task.num_digits={num_digits!r}: must be >= 1")
        limit = 10**num_digits
        if not 1 <= eval_size < limit * limit:
            raise ConfigError(f"task.eval_size={eval_size!r}: must be in [1, {limit * limit})")
        problems = [addition_problem(a, b, num_digits) for a in range(limit) for b in range(limit)]
        super().__init__(*split_once(problems, eval_size, seed), rewards, reward_weights)


class ArithmeticTask(SplitTask):
    """`What is 7 + 12? Answer with the number only.` for every pair of operands in
    [0, max_operand]: questions in words for an instruct model, scored by the last number of
    its answer. The task bench/REAL_TASKS.md measures SmolLM2-135M-Instruct learning."""

    QUESTION = "What is {a} + {b}? Answer with the number only."

    def __init__(
        self,
        max_operand: int = 12,
        eval_size: int = 64,
        seed: int = 0,
        rewards: Sequence = ("last_number",),
        reward_weights: list | None = None,
    ) -> None:
        if max_operand < 1:
            raise ConfigError(f"task.max_operand={max_operand!r}: must be >= 1")
        count = (max_operand + 1) ** 2
        if not 1 <= eval_size < count:
            raise ConfigError(f"task.eval_size={eval_size!r}: must be in [1, {count})")
        operands = range(max_operand + 1)
        # a + b and its twin b + a on the same side: a held-out question whose twin is trained
        # on is not held out
        twins = [[(a, b), (b, a)] if a != b else [(a, a)] for a in operands for b in operands]
        train, eval = split_groups([t for t in twins if t[0][0] <= t[0][1]], eval_size, seed)
        super().__init__(self._ask(train), self._ask(eval), rewards, reward_weights)

    def _ask(self, pairs: list[tuple[int, int]]) -> list[Problem]:
        return [Problem(self.QUESTION.format(a=a, b=b), str(a + b)) for a, b in pairs]


def split_groups(groups: list[list], eval_size: int, seed: int) -> tuple[list, list]:
    """(train, eval) of the groups' items, a group never split: groups in an order fixed by
    seed go to eval while they fit, until it holds eval_size items (singletons fill it)."""
    order = list(range(len(groups)))
    random.Random(seed).shuffle(order)
    train, eval = [], []
    for i in order:
        side = eval if len(eval) + len(groups[i]) <= eval_size else train
        side.extend(groups[i])
    if len(eval) != eval_size:
        raise ConfigError(f"task.eval_size={eval_size!r}: cannot be filled with whole groups")
    return train, eval


def default_rewards(problems: list[Problem]) -> list[str]:
    """task.rewards=auto for a data file: `last_number` when every answer is a number (it reads
    the answer out of free text, as a chat model writes it), else `exact_match`."""
    numeric = all(parse_number(p.answer) is not None for p in problems)
    return ["last_number"] if numeric else ["exact_match"]


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSONL file; a malformed row names its line number."""
    rows = []
    with path.open(encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(
                    f"task.path={str(path)!r}: line {line_number} is not JSON ({e.msg})"
                ) from None
            if not isinstance(row, dict):
                raise ConfigError(f"task.path={str(path)!r}: line {line_number} is not an object")
            rows.append(row)
    return rows


# File suffix -> the `datasets` builder that reads it (JSONL has a reader of its own, above).
DATASET_BUILDERS = {".json": "json", ".csv": "csv", ".parquet": "parquet"}


def read_split(path: Path, split: str, key: str) -> list[dict]:
    """The rows of one split: a JSONL/JSON/CSV/Parquet file (one split, "train") or a directory
    written by `datasets`' save_to_disk. `key` names the setting, for the error."""
    if path.is_file() and path.suffix == ".jsonl":
        data: Any = {"train": read_jsonl(path)}
    else:
        try:
            import datasets
        except ImportError:
            raise ConfigError(
                f"task.path={str(path)!r}: reading it needs the datasets package "
                "(pip install datasets)"
            ) from None
        if path.is_dir():
            data = datasets.load_from_disk(str(path))
        elif path.suffix in DATASET_BUILDERS:
            data = load_local_file(datasets, DATASET_BUILDERS[path.suffix], path)
        else:
            raise ConfigError(
                f"task.path={str(path)!r}: unknown format; one of .jsonl, "
                f"{', '.join(DATASET_BUILDERS)} or a save_to_disk directory"
            )
        if isinstance(data, datasets.Dataset):
            data = {"train": data}
    if split not in data:
        raise ConfigError(f"{key}={split!r}: not a split of {str(path)!r}; it has {list(data)}")
    return [dict(row) for row in data[split]]


def problems_from_rows(
    rows: list[dict], prompt_field: str, answer_field: str, path: str
) -> list[Problem]:
    """Problems from rows, each field checked: a missing one names the fields there are."""
    problems = []
    for i, row in enumerate(rows, start=1):
        for key, field in (
            ("task.prompt_field", prompt_field),
            ("task.answer_field", answer_field),
        ):
            if field not in row:
                raise ConfigError(
                    f"{key}={field!r}: row {i} of {path!r} has no such field; "
                    f"its fields are {sorted(row)}"
                )
        prompt, answer = row[prompt_field], row[answer_field]
        where = f"task.path={path!r}: row {i}, field {prompt_field!r}"
        if not is_prompt(prompt):
            raise ConfigError(f"{where}: must be a string or a list of messages")
        if not isinstance(prompt, str):
            check_messages(prompt, where)
            prompt = [{"role": m["role"], "content": m["content"]} for m in prompt]
        texts = [prompt] if isinstance(prompt, str) else [m["content"] for m in prompt]
        if not any(text.strip() for text in texts):
            raise ConfigError(f"{where}: is empty; every row needs a prompt")
        if _blank(answer):
            raise ConfigError(
                f"task.path={path!r}: row {i}, field {answer_field!r}: is empty; "
                "every row needs a reference answer"
            )
        columns = {key: value for key, value in row.items() if key != prompt_field}
        problems.append(Problem(prompt=prompt, answer=str(answer), columns=columns))
    return problems


def _blank(value: Any) -> bool:
    """Missing, as a file says it: null (an empty CSV cell), NaN (Parquet), or only spaces."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return True
    return not str(value).strip()


class DatasetTask(SplitTask):
    """Question/answer rows from a local file or saved dataset (`task=jsonl task.path=...`).

    The held-out eval split is `eval_split` when given, else `eval_fraction` of `split`'s
    rows chosen once by seed. The reward is `rewards` (`auto`: `default_rewards`).
    """

    def __init__(
        self,
        path: str,
        prompt_field: str = "prompt",
        answer_field: str = "answer",
        split: str = "train",
        eval_split: str | None = None,
        eval_fraction: float = 0.1,
        seed: int = 0,
        rewards: Any = AUTO,
        reward_weights: list | None = None,
    ) -> None:
        if not 0 < eval_fraction < 1:
            raise ConfigError(f"task.eval_fraction={eval_fraction!r}: must be in (0, 1)")
        file = Path(path).expanduser()
        if not file.exists():
            raise ConfigError(f"task.path={path!r}: no such file or directory")

        def load(split_name: str, key: str) -> list[Problem]:
            rows = read_split(file, split_name, key)
            return problems_from_rows(rows, prompt_field, answer_field, path)

        problems = load(split, "task.split")
        if eval_split is not None:
            train, eval = problems, load(eval_split, "task.eval_split")
            if not train or not eval:
                raise ConfigError(f"task.path={path!r}: the train and eval splits need rows")
        else:
            if len(problems) < 2:
                raise ConfigError(f"task.path={path!r}: needs at least 2 rows (train and eval)")
            eval_size = min(len(problems) - 1, max(1, round(eval_fraction * len(problems))))
            train, eval = split_once(problems, eval_size, seed)
        if rewards == AUTO:
            rewards = default_rewards(problems)
        super().__init__(train, eval, rewards, reward_weights)


def load_local_file(datasets: Any, builder: str, path: Path) -> Any:
    """datasets' loader without its "Generating train split" bar: a local file of a few rows
    would print it in every preflight and trial, where a one-line error must stand alone."""
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        return datasets.load_dataset(builder, data_files=str(path))
    finally:
        if was_enabled:
            datasets.enable_progress_bars()
