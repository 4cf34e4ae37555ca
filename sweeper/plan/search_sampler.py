"""The search sampler: Optuna's sampler that proposes each trial's params
(`hydra.sweeper.sampler`), and how many trials the sweep plans. Not the LLM sampler (the
training config's `sampler` group: torch, vllm) that generates rollouts; docs/glossary.md.

`auto` picks an exact grid when every swept key is discrete: each combination is queued
once as a trial with fixed params (sweeper/study/slots.py), so it runs exactly once even across
resumes and workers, and the sampler is never consulted. (Optuna's GridSampler is not used:
it picks points as trials start, which races between workers at the end of a grid.) Any
continuous range makes `auto` pick TPE, which runs `n_trials` trials in total.
"""

from __future__ import annotations

from dataclasses import dataclass

import optuna

from sweeper import SweepError
from sweeper.plan.breaches import AvoidsBreaches
from sweeper.plan.space import SearchSpace


@dataclass
class SearchSampler:
    name: str  # the sampler actually used (auto resolved)
    optuna_sampler: optuna.samplers.BaseSampler
    planned: int  # trials the sweep runs in total: the grid size, or n_trials

    @property
    def is_grid(self) -> bool:
        return self.name == "grid"


def choose_search_sampler(
    name: str, space: SearchSpace, n_trials: int, seed: int | None
) -> SearchSampler:
    """name: one of sweeper.plan.settings_schema.Sampler (checked when composed)."""
    if name == "auto":
        name = "grid" if space.is_discrete else "tpe"
    if name == "grid":
        ranges = [f"{p.key}={p.spec}" for p in space.params.values() if p.values is None]
        if ranges:
            raise SweepError(
                f"sampler=grid needs discrete choices, but {ranges[0]} is a continuous range"
            )
        # Every grid trial has all its params fixed: this sampler only fills the slot.
        return SearchSampler("grid", optuna.samplers.RandomSampler(seed=0), space.grid_size)
    # Every searching sampler steers clear of health breaches (sweeper/plan/breaches.py).
    return SearchSampler(name, AvoidsBreaches(_searching_sampler(name, seed)), n_trials)


def _searching_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    try:
        if name == "gp":
            return optuna.samplers.GPSampler(seed=seed)
        return optuna.samplers.CmaEsSampler(seed=seed)
    except ImportError as e:  # gp needs scipy, cmaes the `cmaes` package
        raise SweepError(f"sampler={name}: a package it needs is missing ({e})") from None
