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

`train` sets the run's CPU threads first (trainer/model/cpu_threads.py) and records the count.

This layer sits on top of the trainer's others (it may import all of them); `trainer.train`
is `train` here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from trainer.base.errors import ConfigError
from trainer.run.validation import validate as validate_common

if TYPE_CHECKING:
    from trainer.run.train import Reporter, TrainResult

__all__ = ["checkpoint_dirs", "configured", "resumed_step", "train", "validate"]


def train(cfg: DictConfig, reporter: Reporter | None = None) -> TrainResult:
    """One training run on the configured backend (the library API: `from trainer import
    train`)."""
    from trainer.packed.members import current_source

    source = current_source()  # a packed trial's: the pack's model (trainer/packed/host.py)
    use_threads(cfg, reporter)
    if cfg.backend.name == "trl":
        if source is not None:
            raise ConfigError("packed trials train with backend=ours")
        from trainer.backends.trl import train as train_with_trl

        return train_with_trl(cfg, reporter)
    from trainer.run.train import train as train_with_ours

    return train_with_ours(cfg, reporter, source)


def configured(cfg: DictConfig, overrides: Iterable[str] | None = None) -> DictConfig:
    """The config a run trains with: a `trl grpo` recipe's values (backend.config) filled in
    where the command line set none; cfg itself without a recipe. ConfigError: a bad recipe."""
    from trainer.backends.trl.recipe import with_recipe

    return with_recipe(cfg, overrides)


def checkpoint_dirs(output_dir: str | Path) -> list[Path]:
    """The checkpoint folders a run in output_dir saved, in either backend's layout."""
    from trainer.backends.trl import checkpoints as trl_checkpoints
    from trainer.run import checkpoint

    return [*checkpoint.checkpoint_dirs(output_dir), *trl_checkpoints.checkpoint_dirs(output_dir)]


def resumed_step(cfg: DictConfig) -> int | None:
    """The checkpoint step a run of this config continues from (None: a fresh start), as the
    backend's train() will load it: the newest checkpoint that reads, not the newest folder."""
    if cfg.backend.name == "trl":  # TRL's own checkpoint folders, counted in our steps
        from trainer.backends.trl.checkpoints import resumed_from_step

        return resumed_from_step(cfg)
    from trainer.run.checkpoint import resumable_step

    return resumable_step(cfg.output_dir) if cfg.resume else None


def use_threads(cfg: DictConfig, reporter: Reporter | None) -> None:
    """Set this process's CPU threads for the run and hand the count to a reporter that
    records it. A run over several processes: each rank sets its own (trainer/backends/rank.py)."""
    from records.metrics import THREADS_PARAM
    from trainer.model import cpu_threads

    if cfg.backend.processes > 1:
        threads = cpu_threads.rank_threads(cfg.model.get("threads", "auto"))
    else:
        threads = cpu_threads.decide(cfg.model.get("threads", "auto"))
        cpu_threads.apply(threads)
    logging.getLogger("trainer").info("CPU threads: %d (%s)", threads.count, threads.why)
    hook = getattr(reporter, "params", None)
    if hook is not None:
        hook({THREADS_PARAM: threads.count})


def validate(cfg: DictConfig) -> list[str]:
    """Every check that runs before a model loads: the common ones (trainer/run/validation.py),
    then the backend's own. Raises ConfigError (one line); returns warnings."""
    from trainer.backends.trl.checks import validate as validate_trl
    from trainer.backends.trl.recipe import notes

    warnings = validate_common(cfg)
    if cfg.backend.name == "trl":
        warnings += validate_trl(cfg) + notes(cfg)  # notes: a recipe's, if any
    return warnings
