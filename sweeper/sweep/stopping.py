"""How a sweep's job stops a trial early: the exception its reporter raises (sweeper/sweep/job.py)
and the objective pruner its trial asks.

Health rules (trainer/run/health/) are our own: Optuna's `trial.report` takes one value per
step, and that value is the objective (eval reward), so rules on other metrics cannot go
through it. The reporter checks them after every step and raises `TrialPruned` with the
breach; the sweeper tells the study PRUNED. Objective pruning (median, hyperband) stays
Optuna's, on the intermediate objective values reported at eval steps.
"""

from __future__ import annotations

import optuna

from trainer.run.health import Breach


class TrialPruned(optuna.TrialPruned):
    """Raised from the reporter to stop training; carries the breach across processes."""

    def __init__(self, breach: Breach | None) -> None:
        super().__init__(str(breach) if breach else "pruned by the objective pruner")
        self.breach = breach

    def __reduce__(self):  # picklable for the joblib launcher, breach included
        return (TrialPruned, (self.breach,))


class TakenOver(Exception):
    """This trial's point now belongs to another worker: record nothing more."""


def make_pruner(name: str, warmup_steps: int) -> optuna.pruners.BasePruner:
    """The objective pruner the job's trial asks at eval steps (none, median, hyperband; the
    forecast is the reporter's own: Optuna's pruners cannot say why)."""
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=warmup_steps)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(1, warmup_steps))
    return optuna.pruners.NopPruner()
