"""`python -m sweeper -m group_size=4,8 lr=1e-5,2e-5`: a GRPO hyperparameter sweep.

conf/sweep.yaml is conf/config.yaml with our Optuna sweeper selected; without `-m` this
runs one training with the defaults, like `python -m trainer`.
"""

from __future__ import annotations

import gc
import sys

from sweeper.sweep import trial_process

if __name__ == "__main__":  # first of all: a trial's imports overlap all the sweep does before
    trial_process.start_for(sys.argv[1:])  # its first job (sweeper/sweep/trial_process.py)

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import analysis.sweep_job  # noqa: F401  (registers the config schemas before Hydra composes)
from trainer.base.config import config_dir
from trainer.base.config_help import without_multirun
from trainer.base.known_keys import unknown_keys

CONFIG_NAME = "sweep"


@hydra.main(version_base="1.3", config_path=config_dir(), config_name=CONFIG_NAME)
def main(cfg: DictConfig) -> float:
    # Imported here, after Hydra composed the config and the sweeper checked every point of
    # the search space: a bad input fails before the trainer's imports (PEFT, transformers, MLflow).
    from sweeper.results import display
    from sweeper.sweep.job import run

    if cfg.trial.id is not None:  # a sweep's trial: its chatter to its log file
        display.trial_output_to_log(HydraConfig.get().verbose)
    return run(cfg)


if __name__ == "__main__":
    try:  # Hydra refuses `-m --cfg job` in a traceback: the config shown is the same without -m
        sys.argv[1:] = without_multirun(sys.argv[1:])
    except ValueError as e:
        sys.exit(f"error: {e}")
    # Before Hydra: it would refuse an unknown key in six lines, and run `+lrr=1e-3` silently.
    if problem := unknown_keys(sys.argv[1:], config_dir(), CONFIG_NAME):
        sys.exit(f"error: {problem}")
    main()
    # All is recorded and said: the interpreter's last collection of the trials' garbage
    # (seconds after the verdict on a 2-core CPU) would free nothing a process that ends
    # needs, so everything alive now is left out of it. Files still flush at exit.
    gc.freeze()
