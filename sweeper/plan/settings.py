"""The sweeper's settings, resolved and checked once, before anything is created.

Choices (sampler, direction, pruner) are Enums in the registered config and fail when Hydra
composes it; every other rule is here, each failing with one line naming the setting, its
value and the rule, like trainer/run/validation.py does for the training config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from judge.stats import MIN_SEEDS
from records.database import (
    DEFAULT_RETRY_S,
    absolute_url,
    missing_driver,
    scheme,
    shown_url,
)
from records.metrics import EVAL_REWARD
from sweeper import SweepError
from sweeper.plan.pack_size import AUTO
from sweeper.plan.settings_schema import GRPOSweeperConf
from trainer.run.health import HealthRule, default_rules, rules_from_settings

RDB_SCHEMES = ("sqlite", "postgresql", "mysql")  # Optuna's storages with heartbeats


def resolve_url(url: str) -> str:
    """hydra.sweeper.storage as an absolute URL, so jobs started in another directory reach
    the same file; only RDB storages (records/optuna_storage.py says why), with their driver."""
    if "://" not in url or scheme(url) not in RDB_SCHEMES:
        raise SweepError(
            f"hydra.sweeper.storage={url!r}: not a database URL; use e.g. sqlite:///sweeps.db "
            "or postgresql://user@host/db"
        )
    missing = missing_driver(url)
    if missing:
        raise SweepError(f"hydra.sweeper.storage={shown_url(url)!r}: {missing}")
    return absolute_url(url)


@dataclass(frozen=True)
class SweepSettings:
    params: dict[str, str]
    search_sampler: str  # hydra.sweeper.sampler: Optuna's, not the LLM's `sampler` group
    seed: int | None
    direction: str
    objective: str
    n_trials: int
    seeds: int  # seeds each configuration starts with (all it gets, unless racing)
    race: bool  # seeds=auto: more seeds only while the verdict is uncertain (judge/race.py)
    max_seeds: int
    min_difference: float | None  # seeds=auto: None, the eval's standard error (judge/race.py)
    budget_seeds: int  # seeds=auto on a grid: at most this many seeds' grid of steps (0: no cap)
    terminator: bool  # stop a search once nothing more is to gain (sweeper/sweep/terminator.py)
    terminator_min_trials: int
    n_jobs: int
    pack: int | str  # jobs trained as one pack (trainer/packed/); 1: one at a time; auto: K
    # chosen by plan_sweep (sweeper/plan/pack_size.py), an int once the plan is made
    max_failure_rate: float
    max_grid_size: int
    storage: str  # absolute URL
    study_name: str | None
    heartbeat_interval: int
    grace_period: int | None
    fail_stale_trials: bool
    db_retry_seconds: float
    max_lost_in_a_row: int
    health_rules: tuple[HealthRule, ...]
    kl_threshold: float
    pruner: str
    pruner_warmup_steps: int
    forecast_level: float

    @property
    def maximize(self) -> bool:
        return self.direction == "maximize"


def _require(ok: bool, name: str, value: Any, rule: str) -> None:
    if not ok:
        raise SweepError(f"hydra.sweeper.{name}={value!r}: {rule}")


def resolve_settings(conf: GRPOSweeperConf, config_kl_threshold: float) -> SweepSettings:
    """Check every setting and fill in the defaults that depend on the job's config."""
    _require(conf.n_trials >= 1, "n_trials", conf.n_trials, "must be >= 1")
    race = conf.seeds == "auto"
    _require(
        race or (isinstance(conf.seeds, int) and conf.seeds >= 1),
        "seeds",
        conf.seeds,
        "must be an integer >= 1, or auto (race seeds up to max_seeds)",
    )
    _require(
        conf.max_seeds >= MIN_SEEDS,
        "max_seeds",
        conf.max_seeds,
        f"must be >= {MIN_SEEDS} (every raced configuration gets {MIN_SEEDS} seeds)",
    )
    _require(
        conf.budget_seeds == 0 or conf.budget_seeds >= MIN_SEEDS,
        "budget_seeds",
        conf.budget_seeds,
        f"must be 0 (no cap) or >= {MIN_SEEDS} (every raced configuration gets {MIN_SEEDS} seeds)",
    )
    low = conf.min_difference
    _require(low is None or low >= 0, "min_difference", low, "must be >= 0, or null (eval stderr)")
    least = conf.terminator_min_trials
    _require(least >= 2, "terminator_min_trials", least, "must be >= 2 (a fit needs 2 points)")
    _require(
        not conf.terminator or least <= conf.n_trials,
        "terminator_min_trials",
        least,
        f"must be <= n_trials={conf.n_trials}, or the terminator never looks",
    )
    _require(conf.n_jobs >= 1, "n_jobs", conf.n_jobs, "must be >= 1")
    pack = conf.pack
    _require(
        pack == AUTO or (isinstance(pack, int) and not isinstance(pack, bool) and pack >= 1),
        "pack",
        pack,
        "must be an integer >= 1, or auto (K from the batch and the device)",
    )
    rate = conf.max_failure_rate
    _require(0 <= rate <= 1, "max_failure_rate", rate, "must be in [0, 1]")
    _require(conf.max_grid_size >= 1, "max_grid_size", conf.max_grid_size, "must be >= 1")
    beat = conf.heartbeat_interval
    _require(beat >= 1, "heartbeat_interval", beat, "must be >= 1")
    grace = conf.grace_period
    _require(
        grace is None or grace > beat,
        "grace_period",
        grace,
        f"must be longer than heartbeat_interval={beat}",
    )
    _require(
        conf.pruner_warmup_steps >= 0,
        "pruner_warmup_steps",
        conf.pruner_warmup_steps,
        "must be >= 0",
    )
    level = conf.forecast_level
    _require(0 < level < 1, "forecast_level", level, "must be in (0, 1)")
    retry = conf.db_retry_seconds if conf.db_retry_seconds is not None else DEFAULT_RETRY_S
    _require(retry >= 0, "db_retry_seconds", retry, "must be >= 0")
    lost = conf.max_lost_in_a_row
    _require(lost >= 1, "max_lost_in_a_row", lost, "must be >= 1")
    threshold = conf.kl_threshold if conf.kl_threshold is not None else config_kl_threshold
    _require(threshold > 0, "kl_threshold", threshold, "must be > 0")
    return SweepSettings(
        params=dict(_plain(conf.params) or {}),
        search_sampler=_value(conf.sampler),
        seed=conf.seed,
        direction=_value(conf.direction),
        objective=conf.objective,
        n_trials=conf.n_trials,
        seeds=MIN_SEEDS if race else conf.seeds,
        race=race,
        max_seeds=conf.max_seeds,
        min_difference=low,
        budget_seeds=conf.budget_seeds,
        terminator=bool(conf.terminator),
        terminator_min_trials=least,
        n_jobs=conf.n_jobs,
        pack=pack,
        max_failure_rate=rate,
        max_grid_size=conf.max_grid_size,
        storage=resolve_url(conf.storage),
        study_name=conf.study_name,
        heartbeat_interval=beat,
        grace_period=grace,
        fail_stale_trials=conf.fail_stale_trials,
        db_retry_seconds=retry,
        max_lost_in_a_row=lost,
        health_rules=_health_rules(conf.health, threshold, _held_out_reward(conf)),
        kl_threshold=threshold,
        pruner=_value(conf.pruner),
        pruner_warmup_steps=conf.pruner_warmup_steps,
        forecast_level=level,
    )


def _held_out_reward(conf: Any) -> str:
    """The held-out reward the default rules read: the objective when it is a held-out reward
    to maximise (e.g. a reward's honest part), else the eval's mean reward."""
    objective = str(conf.objective)
    maximised = _value(conf.direction) == "maximize"
    return objective if maximised and objective.startswith("eval/") else EVAL_REWARD


def _health_rules(given: Any, kl_threshold: float, objective: str) -> tuple[HealthRule, ...]:
    if given is None:
        return tuple(default_rules(kl_threshold, objective))
    given = _plain(given)
    _require(isinstance(given, list), "health", given, "must be a list of rules, or null")
    try:
        return tuple(rules_from_settings(given, kl_threshold))
    except (ValueError, TypeError) as e:
        raise SweepError(f"hydra.sweeper.{e}") from None


def _plain(value: Any) -> Any:
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _value(choice: Any) -> str:
    """An Enum setting as its string (Hydra hands over the member, tests may pass a str)."""
    return str(getattr(choice, "value", choice))
