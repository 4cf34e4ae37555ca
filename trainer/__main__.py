"""`python -m trainer [overrides]`: one GRPO training run, logged to MLflow.

The tracking URI comes from MLFLOW_TRACKING_URI, else MLflow's default (sqlite:///mlflow.db).
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from trainer.backends.logged_run import train_and_log
from trainer.base.config import config_dir
from trainer.base.config_help import without_multirun
from trainer.base.known_keys import unknown_keys

CONFIG_NAME = "config"


@hydra.main(version_base="1.3", config_path=config_dir(), config_name=CONFIG_NAME)
def main(cfg: DictConfig) -> float:
    return train_and_log(cfg)


if __name__ == "__main__":
    try:  # Hydra refuses `-m --cfg job` in a traceback: the config shown is the same without -m
        sys.argv[1:] = without_multirun(sys.argv[1:])
    except ValueError as e:
        sys.exit(f"error: {e}")
    # Before Hydra: it would refuse an unknown key in six lines, and run `+lrr=1e-3` silently.
    if problem := unknown_keys(sys.argv[1:], config_dir(), CONFIG_NAME):
        sys.exit(f"error: {problem}")
    main()
