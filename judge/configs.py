"""One configuration as a sweep recorded it: its seeds, built once from its trial. The race
judges it while it runs, the verdict once the sweep ends: the same type for both."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from records.metrics import is_finite_number
from records.sweep import TrialAttr, replicates


@dataclass(frozen=True)
class Seed:
    seed: int | None  # None: not recorded (judged unpaired)
    value: float | None  # None: this seed was pruned or failed, or has not ended
    stderr: float | None = None  # the eval's standard error over problems
    per_problem: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Config:
    label: str  # "t2"
    params: dict[str, Any] = field(default_factory=dict)
    seeds: tuple[Seed, ...] = ()
    baseline: float | None = None  # mean eval reward at step 0 over its seeds
    race: str = ""  # seeds=auto: why it got the seeds it got (judge/race.py)
    open: bool = False  # still racing or held (its trial not told yet)

    @property
    def completed(self) -> list[Seed]:
        """The seeds with a value (completed, finite)."""
        return [s for s in self.seeds if is_finite_number(s.value)]

    @property
    def values(self) -> list[float]:
        return [s.value for s in self.completed]

    @property
    def by_seed(self) -> dict[int, float]:
        return {s.seed: s.value for s in self.completed if s.seed is not None}

    @property
    def paired(self) -> bool:
        """Every value has its seed: it can be compared paired by seed."""
        values = self.values
        return bool(values) and len(self.by_seed) == len(values)

    @property
    def eval_stderr(self) -> float | None:
        """The eval's standard error over problems, averaged over the seeds that logged one:
        the baseline's stand-in (the same problems, evaluated at step 0)."""
        known = [s.stderr for s in self.seeds if is_finite_number(s.stderr)]
        return sum(known) / len(known) if known else None


def config(
    label: str, values: Sequence[float], seeds: Sequence[int] = (), open: bool = False
) -> Config:
    """A configuration from its values alone (and their seeds, if known): tests, replays."""
    given = list(seeds) or [None] * len(values)
    return Config(
        label, seeds=tuple(Seed(s, v) for s, v in zip(given, values, strict=True)), open=open
    )


def config_of(trial: FrozenTrial) -> Config:
    """A trial's configuration: its seeds as its replicate records hold them (a value only for
    those that completed), open while its trial is RUNNING (racing, or held)."""
    seeds = tuple(Seed(r.seed, r.value, r.stderr, r.per_problem) for r in replicates(trial))
    if not seeds and trial.state == TrialState.COMPLETE:  # recorded before seeds were
        seeds = (Seed(0, trial.value, None),)
    return Config(
        f"t{trial.number}",
        dict(trial.params),
        seeds,
        trial.user_attrs.get(TrialAttr.BASELINE),
        trial.user_attrs.get(TrialAttr.RACE, ""),
        trial.state == TrialState.RUNNING,
    )


def configs_from_trials(trials: Iterable[FrozenTrial]) -> list[Config]:
    """Completed configurations and their seeds, as the sweep recorded them."""
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    return [config_of(t) for t in sorted(done, key=lambda t: t.number)]
