"""Proposals kept away from health breaches: a searching sampler (TPE, random) wrapped so that
a value whose nearest finished trial breached a health rule is drawn again.

Why not Optuna's constraints alone: TPE sets a breaching trial apart before it reads its
state, and once two safe trials exist it lands in TPE's "bad" group whatever it is told, so
the breach constraint the sweep records changes no sample (bench/HEALTH.md). Drawing again
next to a breach is a 1-nearest-neighbour guess at the unsafe region; replayed on a recorded
lr landscape it cut the trials sampled where runs break from 8.82 to 7.48 of 20 (standard
deviation over replays 1.03 and 1.06) with the same best (bench/HEALTH.md).

A point drawn jointly (TPE in Optuna 5 is multivariate after its start-up trials; GP, CMA-ES)
is drawn again whole, and after MAX_DRAWS such draws each param on its own; a param drawn
alone (start-up trials, random) is drawn again with "nearest" measured over the params drawn
so far. For a study over lr alone both are exactly the replayed rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from judge.forecast import is_unsafe
from records.sweep import TrialAttr

MAX_DRAWS = 20  # then the last draw stands: a region all breaches must not stall the study


class AvoidsBreaches(optuna.samplers.BaseSampler):
    def __init__(self, base: optuna.samplers.BaseSampler) -> None:
        self.base = base

    def infer_relative_search_space(self, study, trial):
        return self.base.infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space):
        """The params a sampler draws together (TPE in Optuna 5 is multivariate): the whole
        point drawn again while its nearest finished trial breached."""
        if not search_space:
            return {}
        finished = _finished(study)
        distributions = {**trial.distributions, **search_space}
        for _ in range(MAX_DRAWS):
            params = self.base.sample_relative(study, trial, search_space)
            if not params:  # drawn one at a time instead (start-up trials)
                return params
            if not nearest_breached({**trial.params, **params}, distributions, finished):
                return params
        return {}  # every joint draw lay next to a breach: each param is drawn on its own

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        finished = _finished(study)
        distributions = {**trial.distributions, param_name: param_distribution}
        for _ in range(MAX_DRAWS):
            value = self.base.sample_independent(study, trial, param_name, param_distribution)
            point = {**trial.params, param_name: value}
            if not nearest_breached(point, distributions, finished):
                break
        return value

    def before_trial(self, study, trial):
        self.base.before_trial(study, trial)

    def after_trial(self, study, trial, state, values):
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()


def _finished(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))


def breached(trial: FrozenTrial) -> bool:
    """Pruned by a health rule (the sweep records the breach), not by the objective pruner."""
    reason = trial.user_attrs.get(TrialAttr.PRUNE_REASON)
    return trial.state == TrialState.PRUNED and isinstance(reason, Mapping) and is_unsafe(reason)


def nearest_breached(
    point: Mapping[str, Any],
    distributions: Mapping[str, BaseDistribution],
    finished: Sequence[FrozenTrial],
) -> bool:
    """Whether the finished trial nearest to `point` (over point's params) breached."""
    comparable = [t for t in finished if all(name in t.params for name in point)]
    if not point or not comparable:
        return False
    nearest = min(comparable, key=lambda t: distance(point, t.params, distributions))
    return breached(nearest)


def distance(
    a: Mapping[str, Any], b: Mapping[str, Any], distributions: Mapping[str, BaseDistribution]
) -> float:
    """Euclidean, each param scaled to [0, 1] over its range (in log space for a log range);
    a categorical param counts 0 when equal, 1 when not."""
    return math.sqrt(sum(_gap(a[n], b[n], distributions[n]) ** 2 for n in a))


def _gap(x: Any, y: Any, d: BaseDistribution) -> float:
    if not isinstance(d, FloatDistribution | IntDistribution):  # categorical
        return 0.0 if x == y else 1.0
    low, high, x, y = float(d.low), float(d.high), float(x), float(y)
    if d.log:
        low, high, x, y = (math.log(v) for v in (low, high, x, y))
    return abs(x - y) / (high - low) if high > low else 0.0
