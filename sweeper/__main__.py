"""`python -m sweeper -m group_size=4,8 lr=1e-5,2e-5`: a GRPO hyperparameter sweep.

conf/sweep.yaml is conf/config.yaml with our Optuna sweeper selected; without `-m` this
runs one training with the defaults, like `python -m trainer`.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

import analysis.sweep_job  # noqa: F401  (registers the config schemas before Hydra composes)
from trainer.base.config import config_dir


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="sweep")
def main(cfg: DictConfig) -> float:
    # Imported here, after Hydra composed the config and the sweeper checked every point of
    # the search space: a bad input fails before the trainer's imports (PEFT, transformers, MLflow).
    from sweeper.sweep.job import run

    return run(cfg)


if __name__ == "__main__":
    main()
