"""A `trl grpo` recipe's dataset and rewards as our task: its config (`task_values`, for
trainer/backends/trl/recipe.py) and the task it builds (`RecipeTask`).

The dataset is read as `trl grpo` reads `dataset_name` (datasets' `load_dataset` on a local
directory of data files, with `dataset_config` as its name), and also from a directory written
by `save_to_disk` or one data file (JSONL, JSON, CSV, Parquet), which `trl grpo` cannot read.
Training draws from `train_split`; the objective is our evaluator on `test_split` when the
dataset has it, else on `eval_fraction` of the train split held out once by seed (the run's
first lines say which). Rows are read as task=jsonl reads them (`problems_from_rows`): each
row's other columns reach the rewards, as TRL passes them. `reward_model_name_or_path` is a
reward of its own (`reward_model_entries`), first, as `trl grpo` puts it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from trainer.backends.trl.recipe_file import Recipe, refuse
from trainer.base.errors import ConfigError
from trainer.env.tasks import (
    DATASET_BUILDERS,
    SplitTask,
    load_local_file,
    problems_from_rows,
    split_once,
)

log = logging.getLogger(__name__)

KEY_REWARD_MODEL = "reward_model_name_or_path"

# `trl grpo`'s reward_funcs names (trl/scripts/grpo.py's registry) as importable functions
BUILT_IN_REWARDS = {
    "accuracy_reward": "trl.rewards.accuracy_reward",
    "reasoning_accuracy_reward": "trl.rewards.reasoning_accuracy_reward",
    "think_format_reward": "trl.rewards.think_format_reward",
    "get_soft_overlong_punishment": f"{__name__}.soft_overlong_punishment",
}


def soft_overlong_punishment(completion_ids, **kwargs) -> list[float]:
    """TRL's `get_soft_overlong_punishment` with the values `trl grpo` builds it with."""
    from trl.rewards import get_soft_overlong_punishment

    reward = get_soft_overlong_punishment(max_completion_len=1280, soft_punish_cache=256)
    return reward(completion_ids=completion_ids, **kwargs)


def reward_model_entries(path: str | None, grpo) -> list[dict[str, Any]]:
    """A recipe's `reward_model_name_or_path` as task.rewards entries (trainer/env/
    reward_model.py), none without one: `trl grpo` puts it before reward_funcs, so the recipe's
    reward_weights count it first. Named as TRL names it (the directory's last part) and
    templated with the recipe's chat_template_kwargs, as TRL templates it; a hub name is
    refused (no downloads)."""
    from trainer.env.reward_model import TARGET, local_model_dir

    if not path:
        return []
    where = local_model_dir(path, KEY_REWARD_MODEL)
    entry = {"_target_": TARGET, "path": where, "key": KEY_REWARD_MODEL}
    entry["chat_template_kwargs"] = grpo.chat_template_kwargs
    return [{**entry, "name": Path(where).name}]


def task_values(recipe: Recipe, cfg: DictConfig) -> dict[str, Any]:
    s = recipe.script
    if recipe.mixture.datasets:
        raise refuse("datasets", "...", "dataset mixtures are not supported; use dataset_name")
    if s.dataset_streaming:
        raise refuse("dataset_streaming", True, "a sweep reads the dataset whole")
    if not s.dataset_name:
        raise refuse("dataset_name", None, "must be given")
    if isinstance(s.reward_funcs, str):  # `trl grpo` would read it letter by letter
        raise refuse("reward_funcs", s.reward_funcs, f"must be a list: [{s.reward_funcs}]")
    if not s.reward_funcs and not s.reward_model_name_or_path:
        raise refuse("reward_funcs", s.reward_funcs, "must name at least one reward")
    rewards = reward_model_entries(s.reward_model_name_or_path, recipe.grpo)  # first, as TRL's
    for name in s.reward_funcs or ():
        target = BUILT_IN_REWARDS.get(name, name)
        if "." not in target:
            raise refuse(
                "reward_funcs",
                name,
                f"neither one of TRL's {sorted(BUILT_IN_REWARDS)} nor a dotted import path",
            )
        _check_imports(name, target)
        rewards.append({"_target_": target, "style": "trl", "name": target.rsplit(".", 1)[-1]})
    old = cfg.task
    return {
        "_target_": f"{RecipeTask.__module__}.{RecipeTask.__name__}",
        "dataset_name": str(Path(s.dataset_name).expanduser()),
        "dataset_config": s.dataset_config,
        "train_split": s.dataset_train_split,
        "test_split": s.dataset_test_split,
        "rewards": rewards,
        "reward_weights": None,  # the recipe's reward_weights: task.reward_weights (BACK)
        "reward_timeout": old.get("reward_timeout", 5),
        "chat_template": old.get("chat_template", "auto"),
        "system_prompt": old.get("system_prompt"),
    }


def _check_imports(name: str, target: str) -> None:
    """A dotted reward_funcs entry that does not import, refused naming it (as `trl grpo`,
    the working directory is on the path)."""
    import os
    import sys

    from hydra.utils import get_method

    from records.errors import first_line

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        get_method(target)
    except Exception as e:
        cause = e.__cause__ or e
        raise refuse(
            "reward_funcs", name, f"cannot import it ({type(cause).__name__}: {first_line(cause)})"
        ) from None


def load_splits(dataset_name: str, dataset_config: str | None) -> dict[str, Any]:
    """The dataset's splits by name, read from a local path as `trl grpo` would (no hub)."""
    import datasets

    path = Path(dataset_name).expanduser()
    if not path.exists():
        raise ConfigError(
            f"dataset_name={dataset_name!r}: not a local path; a sweep reads a local dataset (a "
            "directory of data files, a save_to_disk directory or one data file), no hub downloads"
        )
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # the preflight's one-line errors stand alone
    try:
        if path.is_dir() and (
            (path / "dataset_dict.json").exists() or (path / "dataset_info.json").exists()
        ):
            data = datasets.load_from_disk(str(path))
        elif path.is_file():
            if path.suffix not in (*DATASET_BUILDERS, ".jsonl"):
                raise ConfigError(f"dataset_name={dataset_name!r}: unknown data file format")
            builder = DATASET_BUILDERS.get(path.suffix, "json")
            data = load_local_file(datasets, builder, path)
        else:
            data = datasets.load_dataset(str(path), name=dataset_config)
    finally:
        if was_enabled:
            datasets.enable_progress_bars()
    return {"train": data} if isinstance(data, datasets.Dataset) else dict(data)


def has_test_split(splits: dict, train_split: str, test_split: str) -> bool:
    """Whether the objective is read on the recipe's test split (else on a held-out share)."""
    return test_split in splits and test_split != train_split


def eval_source(task_cfg) -> str:
    """Where the objective is read, in words, for a RecipeTask's config."""
    splits = load_splits(task_cfg.dataset_name, task_cfg.dataset_config)
    name = task_cfg.dataset_name
    if has_test_split(splits, task_cfg.train_split, task_cfg.test_split):
        return f"the {task_cfg.test_split!r} split of {name}"
    fraction = task_cfg.get("eval_fraction", 0.1)
    return (
        f"a held-out {fraction:g} of the {task_cfg.train_split!r} split of {name} "
        f"(task.eval_fraction; it has no {task_cfg.test_split!r} split)"
    )


class RecipeTask(SplitTask):
    """The recipe's dataset: train on `train_split`, eval on `test_split` or a held-out share."""

    def __init__(
        self,
        dataset_name: str,
        rewards: list,
        dataset_config: str | None = None,
        train_split: str = "train",
        test_split: str = "test",
        prompt_field: str = "prompt",
        answer_field: str = "solution",
        eval_fraction: float = 0.1,
        seed: int = 0,
        reward_weights: list | None = None,
    ) -> None:
        splits = load_splits(dataset_name, dataset_config)
        if train_split not in splits:
            raise ConfigError(
                f"dataset_train_split={train_split!r}: not a split of {dataset_name!r}; "
                f"it has {sorted(splits)}"
            )

        def problems(split: str) -> list:
            rows = [dict(row) for row in splits[split]]
            return problems_from_rows(rows, prompt_field, answer_field, dataset_name)

        train = problems(train_split)
        if has_test_split(splits, train_split, test_split):
            eval_ = problems(test_split)
        else:
            if not 0 < eval_fraction < 1:
                raise ConfigError(f"task.eval_fraction={eval_fraction!r}: must be in (0, 1)")
            if len(train) < 2:
                raise ConfigError(f"dataset_name={dataset_name!r}: needs at least 2 train rows")
            size = min(len(train) - 1, max(1, round(eval_fraction * len(train))))
            train, eval_ = split_once(train, size, seed)
        if not train or not eval_:
            raise ConfigError(f"dataset_name={dataset_name!r}: the train and eval splits need rows")
        super().__init__(train, eval_, rewards, reward_weights)
