"""One training run logged to MLflow, as `python -m trainer` runs it and each sweep job too.

A module of its own, not the command line's: the sweeper imports it, and a CLI module is not a
library.
"""

from __future__ import annotations

import logging
import sys

from omegaconf import DictConfig

from trainer.backends import validate
from trainer.backends.trl.recipe import with_recipe
from trainer.base.errors import ConfigError

log = logging.getLogger("trainer")


def run_name(cfg: DictConfig) -> str:
    from hydra.core.hydra_config import HydraConfig

    overrides = HydraConfig.get().overrides.task if HydraConfig.initialized() else []
    return " ".join(overrides) or "defaults"


def train_and_log(cfg: DictConfig) -> float:
    """One training run with its own MLflow run; returns the final eval reward.

    Bad settings exit with one line before the MLflow run exists, so they leave nothing.
    """
    try:
        cfg = with_recipe(cfg)  # a `trl grpo` recipe's values, where the command line set none
        validate(cfg)
    except ConfigError as e:
        sys.exit(f"error: {e}")
    # Loaded once the settings hold, so a bad one fails before seconds of imports.
    from records.errors import StoreUnusable
    from records.tracking import MLflowReporter, MLflowRun
    from records.tracking_store import check_tracking_uri
    from trainer.backends import train
    from trainer.backends.run_params import run_params
    from trainer.env.rewards import RewardError

    try:
        tracking_uri = check_tracking_uri()
        run = MLflowRun(cfg.experiment, run_name(cfg))  # opens (the first time: creates) it
    except StoreUnusable as e:
        sys.exit(f"error: {e}")
    run.log_training_config(cfg, run_params(cfg))
    status = "FAILED"
    try:
        result = train(cfg, MLflowReporter(run))
        run.save_artifacts(result.output_dir / "adapter", "adapter")
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except RewardError as e:  # a reward function's bug: one line naming the reward
        sys.exit(f"error: {e}")
    finally:
        run.end(status)
    baseline = "n/a" if result.baseline_eval is None else f"{result.baseline_eval:.3f}"
    log.info(
        "eval/reward/mean: %s -> %.3f; adapter in %s; MLflow run %s",
        baseline,
        result.final_eval,
        result.output_dir / "adapter",
        run.url(tracking_uri),
    )
    return result.final_eval
