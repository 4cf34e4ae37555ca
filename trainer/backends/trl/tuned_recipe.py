"""A run's `trl grpo --config` recipe with a trial's tuned values filled in under TRL's
names (`tuned_recipe`, for `python -m analysis best --trl-recipe`): `trl grpo --config` runs it.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from trainer.backends.trl.mapping import TABLE
from trainer.backends.trl.recipe import BACK, OWNED, explicit_keys, plain, with_recipe
from trainer.backends.trl.recipe_file import KEY, read
from trainer.backends.trl.recipe_model import model_config

# our LoRA keys under ModelConfig's names (use_peft follows lora_rank)
LORA_NAMES = {
    "lora_rank": "lora_r",
    "lora_alpha": "lora_alpha",
    "lora_dropout": "lora_dropout",
    "lora_target_modules": "lora_target_modules",
}
PICKS = ("backend", "backend.name", KEY)  # what picks the backend and the recipe


def tuned_recipe(cfg: DictConfig, overrides: list[str], notes: dict[str, Any]) -> str:
    """The recipe's YAML as written, with a trial's overrides filled in under TRL's names:
    `trl grpo --config` runs it. cfg: the trial's composed config (hydra node included);
    the notes become comment lines, with the overrides TRL has no field for."""
    import yaml

    resolved = with_recipe(cfg, overrides)
    recipe = read(cfg.backend.config)
    resolved.output_dir = str(recipe.grpo.output_dir)  # owned: the recipe's stays (no hydra run)
    fields, ours_only = trl_fields(resolved, explicit_keys(overrides))
    header = [f"# {k}: {v}" for k, v in notes.items()]
    header.append(f"# from {recipe.path} (sha256 {recipe.sha256}), tuned values filled in")
    if ours_only:
        header.append(f"# the sweep's own settings, no TRL field: {', '.join(ours_only)}")
    written = dict(recipe.written)
    if {"per_device_train_batch_size", "steps_per_generation"} & set(fields):
        written.pop("generation_batch_size", None)  # TRL refuses it beside steps_per_generation
    body = yaml.safe_dump({**written, **fields}, sort_keys=False)
    return "\n".join(header) + "\n" + body


def trl_fields(cfg: DictConfig, keys: set[str]) -> tuple[dict[str, Any], list[str]]:
    """(TRL's fields -> values, the keys with no TRL field) for the keys of a resolved cfg."""
    from records.tuned_file import NOT_TUNED_KEYS
    from trainer.backends.trl.mapping import grpo_kwargs

    kwargs = grpo_kwargs(cfg, _lr(cfg))
    fields: dict[str, Any] = {}
    ours_only = []
    for key in sorted(keys):
        if key in PICKS or key.split(".")[0] in NOT_TUNED_KEYS:  # not a training setting
            continue
        grpo_name = key.removeprefix("backend.grpo.")
        if grpo_name != key:  # a TRL name: the field itself (ours, when translated)
            row = BACK.get(grpo_name)
            fields[grpo_name] = kwargs[grpo_name] if row is None else _value(cfg, row.key)
            continue
        found = {
            row.field: kwargs[row.field]
            for row in TABLE
            if row.field not in OWNED and any(_covers(key, k) for k in row.ours.split(", "))
        }
        if any(_covers(key, k) for k in LORA_NAMES):
            found["use_peft"] = cfg.lora_rank > 0
            found |= {
                trl: _value(cfg, ours) for ours, trl in LORA_NAMES.items() if _covers(key, ours)
            }
        if _covers(key, "model.path"):
            found["model_name_or_path"] = cfg.model.path
        if "reward_weights" in found:
            found["reward_weights"] = _value(cfg, "task.reward_weights")
        fields.update(found)
        if not found:
            ours_only.append(f"{key}={_value(cfg, key)}")
    return {k: plain(v) for k, v in fields.items()}, ours_only


def _covers(given: str, key: str) -> bool:
    """Whether setting `given` sets `key` (itself, or its group: loss=dapo sets loss.name)."""
    return key == given or key.startswith(given + ".")


def _value(cfg: DictConfig, key: str) -> Any:
    value = OmegaConf.select(cfg, key)
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _lr(cfg: DictConfig) -> float:
    """The run's lr as TRL gets it (lr=auto from the model's hidden size)."""
    from trainer.run.lr import resolve_lr

    return resolve_lr(cfg, model_config(cfg.model.path)["hidden_size"])
