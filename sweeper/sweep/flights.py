"""A configuration in flight and its jobs: which seeds started and ended, where its race
stands, and the Hydra overrides each seed's job runs with.

A configuration taken from the plan moves through these phases (the loop,
sweeper/sweep/loop.py, makes the moves; this says what they are):

    TRAINING --a seed fails, or is stopped and not counted at the floor--> BROKEN
        --its started seeds end--> told
    (a seed a health rule stops, with a floor to count it at, ends like any other: tell.py)
    TRAINING --every started seed ended--> a look (racing.py with seeds=auto, else STOP):
        SEED -> TRAINING (one more seed)    HOLD -> HOLDING    STOP -> told
    HOLDING --another configuration told, or a poll--> a look, as above

Told: its trial gets the configuration's outcome (tell.py) and it leaves the flight.

Pure: the loop keeps the flights and launches the jobs; this only says what they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.utils import JobReturn
from optuna.trial import Trial

from records.sweep import TrialAttr
from sweeper import optuna_adapter as oa
from sweeper.plan.settings import SweepSettings
from sweeper.plan.space import SearchSpace, format_value


@dataclass
class Job:
    """One training run: one seed of one configuration."""

    trial: Trial
    seed: int
    replicate: int  # 0 for the first seed
    overrides: list[str]


class Phase(Enum):
    TRAINING = "training"  # seeds queued or running
    BROKEN = "broken"  # a seed failed or stopped uncounted: no more start; told once all end
    HOLDING = "holding"  # seeds=auto, all seeds ended: it leads and waits for those to come,
    # or waits for a leader still racing to be judged again on the leader's last mean


def seeds_of(base_seed: int, count: int) -> list[int]:
    """The seeds a configuration runs with: the config's seed, then the next ones."""
    return [base_seed + i for i in range(count)]


@dataclass
class InFlight:
    """A configuration being trained: which of its seeds started and ended, and its phase."""

    trial: Trial
    seeds: list[int]
    config_run_id: str | None  # its MLflow run when it has several seeds
    started: int = 0
    ended: dict[int, JobReturn | None] = field(default_factory=dict)  # None: carried over
    phase: Phase = Phase.TRAINING

    @property
    def seeds_ended(self) -> bool:
        """Every seed it will start has ended: time to look (or, broken, to be told)."""
        all_started = self.phase is Phase.BROKEN or self.started == len(self.seeds)
        return all_started and len(self.ended) == self.started


def planned(flights: dict[int, InFlight]) -> dict[int, int]:
    """The seeds each configuration in flight is to run, by trial number (racing.Budget)."""
    return {number: len(f.seeds) for number, f in flights.items()}


def seed_job(
    flight: InFlight,
    seed: int,
    *,
    settings: SweepSettings,
    study_name: str,
    parent_run_id: str,
    space: SearchSpace,
) -> Job:
    """The job that trains one seed of a configuration in flight."""
    replicate = flight.seeds.index(seed)
    overrides = job_overrides(
        flight,
        seed,
        replicate,
        settings=settings,
        study_name=study_name,
        parent_run_id=parent_run_id,
        space=space,
    )
    return Job(flight.trial, seed, replicate, overrides)


def job_overrides(
    flight: InFlight,
    seed: int,
    replicate: int,
    *,
    settings: SweepSettings,
    study_name: str,
    parent_run_id: str,
    space: SearchSpace,
) -> list[str]:
    """The Hydra overrides of one seed's job: the point, the seed, and where to report."""
    trial = flight.trial
    binding = {
        "trial.id": oa.trial_id(trial),
        "trial.number": trial.number,
        "trial.replicate": replicate,
        "trial.storage": settings.storage,
        "trial.study": study_name,
        "trial.parent_run_id": flight.config_run_id or parent_run_id,
        "trial.db_retry_seconds": settings.db_retry_seconds,
    }
    quoted = [f"{k}={quote(v)}" for k, v in binding.items()]
    several = len(flight.seeds) > 1
    seeded = [f"seed={seed}"] if several else []
    subdir = f"hydra.sweep.subdir=t{trial.number}" + (f"-s{seed}" if several else "")
    # A retried point continues in the interrupted run's folder, from its last checkpoint.
    resume = trial.user_attrs.get(TrialAttr.RESUME_DIRS, {}).get(str(seed))
    resumed = [f"output_dir={quote(resume['output_dir'])}", "resume=true"] if resume else []
    return [*space.overrides(trial.params), *seeded, *quoted, subdir, *resumed]


def quote(value: Any) -> str:
    """A binding value as an override: strings quoted (URLs hold ':', '@', '?')."""
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return format_value(value)
