"""What a sweep will run, decided and checked before anything heavy loads.

The settings, the search space, the search sampler, the study's name, and every
configuration the space can reach composed and validated (sweeper/plan/preflight.py). This
module and what it imports stay free of MLflow, PEFT, transformers and the trainer, so a bad
input fails within seconds of the command; sweeper/sweep/loop.py, which runs the plan, loads
them afterwards.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from sweeper import SweepError
from sweeper.plan.eval_power import warn_eval_size
from sweeper.plan.pack_size import AUTO, auto_pack
from sweeper.plan.preflight import check_configurations
from sweeper.plan.search_sampler import SearchSampler, choose_search_sampler
from sweeper.plan.settings import SweepSettings, resolve_settings
from sweeper.plan.settings_schema import GRPOSweeperConf
from sweeper.plan.space import SearchSpace, parse_space

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepPlan:
    settings: SweepSettings
    space: SearchSpace
    search_sampler: SearchSampler
    name: str  # the study's


def plan_sweep(
    conf: GRPOSweeperConf, master_config: DictConfig, config_loader, arguments: list[str]
) -> SweepPlan:
    """The sweep the command asks for; SweepError on the first thing that cannot work."""
    s = resolve_settings(conf, master_config.kl_threshold)
    space = parse_space(s.params, arguments)
    if (s.seeds > 1 or s.race) and "seed" in space.params:
        raise SweepError("seed is swept and hydra.sweeper.seeds > 1: use one or the other")
    search_sampler = choose_search_sampler(s.search_sampler, space, s.n_trials, s.seed)
    if s.terminator and search_sampler.is_grid:
        raise SweepError(
            "hydra.sweeper.terminator=true: only a search (tpe, gp, random, cmaes) can stop "
            "early; a grid runs each of its points once (give a range, e.g. "
            "lr='tag(log, interval(1e-4,1e-2))')"
        )
    name = s.study_name or default_study_name(space, search_sampler, s)
    checked = check_configurations(config_loader, master_config, space)
    warn_eval_size(config_loader, master_config, space, s.objective, s.min_difference)
    if space.is_discrete:
        log.debug("Checked %d configurations of the search space", checked)
    else:  # a range has no count of configurations: what was checked is its ends
        log.debug("Checked the search space at %d corners (each range at its ends)", checked)
    if search_sampler.is_grid and search_sampler.planned > s.max_grid_size:
        raise SweepError(
            f"hydra.sweeper.max_grid_size={s.max_grid_size}: the grid has "
            f"{search_sampler.planned} points; to run them all, confirm with "
            f"hydra.sweeper.max_grid_size={search_sampler.planned}"
        )
    if s.pack == AUTO:  # once the sweep holds: its largest batch is a valid one
        jobs = search_sampler.planned * (s.max_seeds if s.race else s.seeds)
        s = dataclasses.replace(s, pack=auto_pack(master_config, space, jobs))
    return SweepPlan(s, space, search_sampler, name)


def default_study_name(space: SearchSpace, search_sampler: SearchSampler, s: SweepSettings) -> str:
    """Stable for the same command: a hash of the sorted overrides and search settings."""
    swept = [f"{p.key}={p.spec}" for p in space.params.values()]
    key: dict[str, Any] = {
        "overrides": sorted([*space.fixed, *swept]),
        "sampler": search_sampler.name,
        "objective": s.objective,
        "direction": s.direction,
    }
    if s.race:
        key["seeds"] = f"auto<={s.max_seeds}"
    elif s.seeds > 1:  # replicates make another plan; one seed keeps the names studies had
        key["seeds"] = s.seeds
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return f"grpo-{digest[:8]}"
