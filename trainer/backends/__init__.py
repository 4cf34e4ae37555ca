"""Trial backends: the GRPO trainer behind one run, chosen by `backend=ours|trl`.

A backend is a function `train(cfg, reporter) -> TrainResult` (trainer/run/train.py defines
both types): it trains from the composed config, calls `reporter.report(step, metrics)` at
step 0 (the baseline eval) and after every training step with metrics under the names of
records/metrics.py (the reporter may raise to stop it, as a pruned sweep trial does),
and returns the final eval with its per-problem rewards. The sweeper, the records, the
verdict and the report read nothing else, so they do not care which backend trained a run.

`backend=ours` is trainer.run.train, this package's trainer, in one process; `backend=trl` is
TRL's GRPOTrainer with PEFT LoRA, in one or several processes. Modules:

  trl          TRL's backend: config mapping, data, rewards, callback, checkpoints
  distributed  one run over several processes (torch.distributed's launcher), either backend
  rank         a rank of such a run, and the launcher that starts the ranks
  logged_run   one training run logged to MLflow (`python -m trainer`, and each sweep job)
  run_params   what a run records beside its hyperparameters (backend, version, oneDNN)

This layer sits on top of the trainer's others (it may import all of them); `trainer.train`
is `train` here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omegaconf import DictConfig

from trainer.run.validation import validate as validate_common

if TYPE_CHECKING:
    from trainer.run.train import Reporter, TrainResult

__all__ = ["train", "validate"]


def train(cfg: DictConfig, reporter: Reporter | None = None) -> TrainResult:
    """One training run on the configured backend (the library API: `from trainer import
    train`)."""
    if cfg.backend.name == "trl":
        from trainer.backends.trl import train as train_with_trl

        return train_with_trl(cfg, reporter)
    from trainer.run.train import train as train_with_ours

    return train_with_ours(cfg, reporter)


def validate(cfg: DictConfig) -> list[str]:
    """Every check that runs before a model loads: the common ones (trainer/run/validation.py),
    then the backend's own. Raises ConfigError (one line); returns warnings."""
    from trainer.backends.trl.mapping import validate as validate_trl
    from trainer.backends.trl.recipe import notes

    warnings = validate_common(cfg)
    if cfg.backend.name == "trl":
        warnings += validate_trl(cfg) + notes(cfg)  # notes: a recipe's, if any
    return warnings
