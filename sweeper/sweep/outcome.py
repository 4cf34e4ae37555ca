"""A configuration's seeds -> the configuration's outcome, what the study is told.

Pure: the sweeper reads the replicates the jobs recorded and tells Optuna what this returns.
A configuration is as healthy as its worst seed: one seed pruned (it broke) prunes the
configuration; one failed fails it; otherwise its objective is the mean over its seeds, which
is what TPE learns from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import mean
from typing import Any

from analysis.records import Replicate, State
from trainer.base.metrics import is_finite_number


@dataclass(frozen=True)
class ConfigOutcome:
    state: str  # State.*
    value: float | None  # mean objective over the seeds (COMPLETE only)
    reason: str  # why it was pruned or failed ('' otherwise)
    breach: dict[str, Any] | None  # the health rule that pruned it
    steps_run: int  # training steps, all seeds together
    baseline: float | None  # mean eval reward at step 0


def seeds_of(base_seed: int, count: int) -> list[int]:
    """The seeds a configuration runs with: the config's seed, then the next ones."""
    return [base_seed + i for i in range(count)]


def combine(replicates: Sequence[Replicate], expected: int) -> ConfigOutcome:
    """The configuration's outcome from the seeds that ran (missing seeds never started)."""
    steps = sum(r.steps_run for r in replicates)
    baselines = [r.baseline for r in replicates if is_finite_number(r.baseline)]
    baseline = mean(baselines) if baselines else None
    pruned = [r for r in replicates if r.state == State.PRUNED]
    failed = [r for r in replicates if r.state == State.FAIL]
    if pruned:
        first = min(pruned, key=lambda r: r.seed)
        reason = first.reason if expected == 1 else f"seed {first.seed}: {first.reason}"
        return ConfigOutcome(State.PRUNED, None, reason, first.breach, steps, baseline)
    done = [r for r in replicates if r.state == State.COMPLETE and is_finite_number(r.value)]
    if failed or len(done) < expected:
        first = min(failed, key=lambda r: r.seed) if failed else None
        if first is None:
            reason = f"{expected - len(done)} of {expected} seeds ended without an objective"
        elif expected == 1:
            reason = first.reason
        else:
            reason = f"{len(failed)} of {expected} seeds failed; seed {first.seed}: {first.reason}"
        return ConfigOutcome(State.FAIL, None, reason, None, steps, baseline)
    return ConfigOutcome(State.COMPLETE, mean(r.value for r in done), "", None, steps, baseline)
