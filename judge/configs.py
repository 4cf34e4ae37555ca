"""One configuration as a sweep recorded it: its seeds, built once from its trial. The race
judges it while it runs, the verdict once the sweep ends: the same type for both.

A seed a health rule stopped broke: it counts at the objective's floor (its worst value, when
the objective's range is known), as every seed counts in the mean over seeds an RL paper
reports. The rules stop a run before its eval has fallen all the way (that is their job), so
its last eval would flatter it; a run that broke ends near the floor (bench/COST.md, issue 72).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from judge.forecast import is_unsafe
from judge.stats import MIN_SEEDS
from records.metrics import is_finite_number
from records.sweep import Replicate, State, TrialAttr, replicates


@dataclass(frozen=True)
class Seed:
    seed: int | None  # None: not recorded (judged unpaired)
    value: float | None  # None: this seed was pruned or failed, or has not ended
    stderr: float | None = None  # the eval's standard error over problems
    per_problem: tuple[float, ...] | None = None
    broke: bool = False  # a health rule stopped it: its value is the objective's floor


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
    def broke(self) -> int:
        """How many of its seeds broke (counted at the floor)."""
        return sum(s.broke for s in self.seeds)

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


def broke(record: Replicate) -> bool:
    """A seed a health rule stopped (not a forecast's stop, a warning or a failure)."""
    return record.state == State.PRUNED and record.breach is not None and is_unsafe(record.breach)


def objective_range(objective: str, seen: Iterable[Any]) -> tuple[float, float] | None:
    """(0, 1) for an eval's mean reward (`eval/reward/mean`, one reward's, the greedy one's)
    whose every recorded value and baseline (`seen`) lies in [0, 1], as the built-in rewards'
    do; None (unbounded) otherwise."""
    rewards = objective.startswith(("eval/reward/", "eval/greedy/"))
    if not rewards or objective.endswith("/stderr"):
        return None
    known = [v for v in seen if is_finite_number(v)]
    return (0.0, 1.0) if all(0 <= v <= 1 for v in known) else None


def break_floor(objective: str, maximize: bool, trials: Iterable[FrozenTrial]) -> float | None:
    """What a seed that broke counts at: the objective's worst value, from its range and the
    values the study recorded; None when the range is unknown (a configuration whose seed
    broke then ends pruned, uncounted)."""
    seen = [v for t in trials for r in replicates(t) for v in (r.value, r.baseline)]
    bounds = objective_range(objective, seen)
    if bounds is None:
        return None
    return bounds[0] if maximize else bounds[1]


def at_floor(record: Replicate, floor: float | None) -> bool:
    """Whether a seed counts at the floor: it broke, and there is a floor to count it at."""
    return floor is not None and broke(record)


def counts_broken(trial: FrozenTrial, seed: int, floor: float | None) -> bool:
    """Whether the trial's `seed` broke and counts at the floor."""
    return any(at_floor(r, floor) for r in replicates(trial) if r.seed == seed)


def broke_note(broken: int, seeds: int, floor: float) -> str:
    """`1 of 2 seeds broke (counted at 0)`: the one wording of a configuration's breaks."""
    return f"{broken} of {seeds} seeds broke (counted at {floor:g})"


def seed_of(record: Replicate, floor: float | None) -> Seed:
    """One seed as the judge counts it: a broken one at the floor, when there is one."""
    if at_floor(record, floor):
        return Seed(record.seed, floor, broke=True)
    return Seed(record.seed, record.value, record.stderr, record.per_problem)


def counted(trial: FrozenTrial, floor: float | None) -> bool:
    """Whether the judge counts a trial: completed, or pruned with every seed broken, at least
    MIN_SEEDS of them (one run that broke says it broke, not where its mean lies), and a floor
    to count them at."""
    if trial.state == TrialState.COMPLETE:
        return True
    seeds = replicates(trial)
    return (
        floor is not None
        and trial.state == TrialState.PRUNED
        and len(seeds) >= MIN_SEEDS
        and all(broke(r) for r in seeds)
    )


def config_of(trial: FrozenTrial, floor: float | None = None) -> Config:
    """A trial's configuration: its seeds as its replicate records hold them (a value only for
    those that completed, and for those that broke when there is a `floor`: break_floor), open
    while its trial is RUNNING (racing, or held)."""
    seeds = tuple(seed_of(r, floor) for r in replicates(trial))
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


def configs_from_trials(trials: Iterable[FrozenTrial], floor: float | None = None) -> list[Config]:
    """The configurations the judge counts (`counted`) and their seeds, as the sweep recorded
    them; floor: break_floor."""
    done = [t for t in trials if counted(t, floor)]
    return [config_of(t, floor) for t in sorted(done, key=lambda t: t.number)]
