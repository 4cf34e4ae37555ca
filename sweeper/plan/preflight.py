"""Check every configuration a sweep can reach before its first trial starts.

Each grid point (or, for ranges, each combination of endpoints) is composed the way the
launcher will compose it (`load_sweep_config`) and checked with `trainer.run.validation`, so a
misspelt key or an impossible value fails in seconds, with one line, and before any study
or MLflow run exists. Past MAX_COMBINATIONS points we check each value on its own instead
(the other keys at their first value): interactions then go unchecked, values do not.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator

from hydra.errors import HydraException
from omegaconf import DictConfig, open_dict
from omegaconf.errors import OmegaConfBaseException

from sweeper import SweepError
from sweeper.plan.space import SearchSpace, Value
from trainer.backends import configured, validate
from trainer.base.errors import ConfigError
from trainer.env.reward_check import check_task_rewards

log = logging.getLogger(__name__)

MAX_COMBINATIONS = 256


def check_configurations(config_loader, master_config: DictConfig, space: SearchSpace) -> int:
    """Compose and validate every configuration to check; return how many were checked."""
    warnings: set[str] = set()
    checked: set[str] = set()  # the task configs whose rewards were called once
    count = 0
    points = configurations_to_check(space)
    for values in points:
        error = _error_at(config_loader, master_config, space, values, warnings, checked)
        if error is not None:
            # The point is named only where it matters: an error of the first point that the
            # next point repeats (a model path, a task file) is not the swept values' doing.
            following = next(points, None)
            shared = count == 0 and (
                following is None
                or error
                == _error_at(config_loader, master_config, space, following, set(), checked)
            )
            where = " ".join(space.params[k].override(v) for k, v in values.items())
            raise SweepError(error if shared or not where else f"{error} (at {where})")
        count += 1
    for warning in sorted(warnings):
        log.warning(warning)
    return count


def _error_at(
    config_loader, master_config, space: SearchSpace, values, warnings: set, checked: set
) -> str | None:
    """The one-line error of the configuration at these values, or None when it holds."""
    cfg = compose(config_loader, master_config, space.overrides(values), keep_hydra=True)
    try:
        cfg = trial_config(cfg)
        warnings.update(validate(cfg))
        check_task_rewards(cfg.task, checked)
    except ConfigError as e:
        return str(e)
    return None


def trial_config(cfg: DictConfig) -> DictConfig:
    """What the trial trains with (a `trl grpo` recipe's values filled in: they need the
    overrides, in the hydra node), the hydra node dropped."""
    cfg = configured(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def configurations_to_check(space: SearchSpace) -> Iterator[dict[str, Value]]:
    names = list(space.params)
    endpoints = [space.params[n].endpoints for n in names]
    total = 1
    for values in endpoints:
        total *= len(values)
    if total <= MAX_COMBINATIONS:
        for combo in itertools.product(*endpoints):
            yield dict(zip(names, combo, strict=True))
        return
    first = {n: values[0] for n, values in zip(names, endpoints, strict=True)}
    for name, values in zip(names, endpoints, strict=True):
        for value in values:
            yield {**first, name: value}


def compose(
    config_loader, master_config: DictConfig, overrides: list[str], keep_hydra: bool = False
) -> DictConfig:
    """The config of one trial as the launcher composes it; errors in one line.

    Without keep_hydra the hydra node is dropped, leaving what the job receives.
    """
    try:
        cfg = config_loader.load_sweep_config(master_config, overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise SweepError(one_line(e)) from None
    if not keep_hydra:
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


def one_line(error: Exception) -> str:
    """Hydra's composition errors span lines (an option list, a key path): join them."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(("full_key", "object_type"))]
    return " ".join(lines[:12]) or type(error).__name__
