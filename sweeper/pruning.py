"""When to stop a trial early.

KL pruning is our own rule rather than an Optuna pruner: Optuna's `trial.report` takes one
value per step, and that value is the objective (eval reward), so a threshold on a second
metric cannot go through it. The job checks the rule after every step and the sweeper tells
the study PRUNED. Objective pruning (median, hyperband) stays Optuna's, on the intermediate
objective values reported at eval steps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import optuna

KL_METRICS = ("kl_sample_train_v2", "kl_sample_train_v1", "kl_policy_ref")
PRUNERS = ("none", "median", "hyperband")


@dataclass(frozen=True)
class PruneReason:
    """Why a trial stopped early; stored as the trial's `prune_reason` user attr."""

    metric: str
    value: float
    step: int
    threshold: float | None  # None for an objective pruner (its bar moves with the study)

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        if self.threshold is None:
            return f"{self.metric}={self.value:.3g} below the pruner's bar at step {self.step}"
        return f"{self.metric}={self.value:.3g} > {self.threshold:g} at step {self.step}"


class TrialPruned(optuna.TrialPruned):
    """Raised from the reporter to stop training; carries the reason across processes."""

    def __init__(self, reason: PruneReason) -> None:
        super().__init__(str(reason))
        self.reason = reason

    def __reduce__(self):  # picklable for the joblib launcher, reason included
        return (TrialPruned, (self.reason,))


@dataclass
class KLPruneRule:
    """Prune once `metric` exceeds `threshold` on `patience` consecutive steps.

    Steps up to `warmup_steps` are not checked. A step without the metric (kl_policy_ref
    is only logged with a KL penalty) or with NaN (the trainer fails such a run itself)
    neither counts nor resets the streak.
    """

    metric: str = "kl_sample_train_v2"
    threshold: float = 0.01
    patience: int = 1
    warmup_steps: int = 0
    _streak: int = 0

    def __post_init__(self) -> None:
        if self.metric not in KL_METRICS:
            raise ValueError(f"kl_metric={self.metric!r}: must be one of {KL_METRICS}")
        if not self.threshold > 0:
            raise ValueError(f"kl_threshold={self.threshold!r}: must be > 0")
        if self.patience < 1:
            raise ValueError(f"kl_patience={self.patience!r}: must be >= 1")

    def check(self, step: int, metrics: Mapping[str, float]) -> PruneReason | None:
        value = metrics.get(self.metric)
        if step <= self.warmup_steps or value is None or math.isnan(value):
            return None
        self._streak = self._streak + 1 if value > self.threshold else 0
        if self._streak >= self.patience:
            return PruneReason(self.metric, float(value), step, self.threshold)
        return None


def make_pruner(name: str, warmup_steps: int) -> optuna.pruners.BasePruner:
    """The objective pruner the job's trial asks at eval steps (none, median, hyperband)."""
    if name == "none":
        return optuna.pruners.NopPruner()
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=warmup_steps)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(1, warmup_steps))
    raise ValueError(f"pruner={name!r}: must be one of {PRUNERS}")
