"""The pipeline settings' names and rules (trainer/rl/pipelines.py runs them).

Kept apart from the pipelines and free of torch, PEFT and transformers: the config checks
import it, and they run before any of those is loaded, so a bad input fails in a second.
"""

from __future__ import annotations

from omegaconf import DictConfig

PIPELINES = ("sync", "stream", "async")


def groups_per_batch(cfg: DictConfig) -> int:
    return cfg.groups_per_batch or cfg.batch_size


def check(cfg: DictConfig) -> list[tuple[bool, str, object, str]]:
    """The pipeline's rules as (ok, name, value, rule) for trainer/run/validation.py."""
    n = groups_per_batch(cfg)
    substeps = cfg.num_substeps
    rules = [
        (cfg.pipeline in PIPELINES, "pipeline", cfg.pipeline, f"must be one of {PIPELINES}"),
        (
            cfg.groups_per_batch >= 0,
            "groups_per_batch",
            cfg.groups_per_batch,
            "must be >= 0; 0: batch_size",
        ),
        (cfg.num_minibatches >= 1, "num_minibatches", cfg.num_minibatches, "must be >= 1"),
        (
            cfg.max_steps_off_policy >= 0,
            "max_steps_off_policy",
            cfg.max_steps_off_policy,
            "must be >= 0",
        ),
    ]
    if cfg.pipeline == "stream":
        per = substeps * cfg.num_minibatches
        rules.append(
            (
                n % per == 0,
                "num_minibatches",
                cfg.num_minibatches,
                f"groups_per_batch={n} must be divisible by num_substeps x num_minibatches = {per}",
            )
        )
        rules.append(
            (
                cfg.scale_rewards != "batch",
                "scale_rewards",
                cfg.scale_rewards,
                "batch needs the whole batch before training: use pipeline=sync or scale_rewards=group",
            )
        )
    if cfg.pipeline == "async":
        rules.append(
            (
                n % substeps == 0,
                "num_substeps",
                substeps,
                f"groups_per_batch={n} must be divisible by num_substeps",
            )
        )
        rules.append(
            (
                cfg.sampler.name == "torch",
                "sampler.name",
                cfg.sampler.name,
                "pipeline=async samples on a copy of the policy in this process: use sampler=torch",
            )
        )
    return rules
