"""Stop a search when nothing more is to gain (`hydra.sweeper.terminator=true`).

Optuna's terminator rule (Makarova et al. 2022, "Automatic Termination for Hyperparameter
Optimization"): a Gaussian process fitted to the best configurations bounds how much better
than the current best any configuration of the space could plausibly be (the regret bound,
`optuna.terminator.RegretBoundEvaluator`); once that bound is below the noise of the best
configuration's own value, another trial cannot find a difference the verdict could tell
apart, and the search stops.

The noise is what the sweep already measures (records/sweep.py `Replicate`): the standard
error of the best configuration's mean over its seeds when it has 2 or more (run-to-run noise,
what a rerun would move), else its eval's standard error over problems (the only noise one
seed has; smaller than run-to-run noise, so with one seed the rule stops later, not sooner).
Optuna's CrossValidationErrorEvaluator plays the same part for cross-validation folds.

The evaluators are called here rather than through `optuna.terminator.Terminator`, whose
`should_terminate` returns a bare bool: the numbers go into the recorded reason.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Sequence

import optuna
from optuna.study import StudyDirection
from optuna.terminator import RegretBoundEvaluator
from optuna.trial import FrozenTrial, TrialState

from judge.stats import mean_and_stderr
from records.sweep import State, StudyAttr, Tag, best_trial, finite_or_none, replicates
from sweeper.plan.settings import SweepSettings
from sweeper.results import display, runs
from sweeper.results.display import say

log = logging.getLogger(__name__)


def best_noise(best: FrozenTrial) -> tuple[float | None, str]:
    """The standard error of the best configuration's value and what it is over (None:
    nothing measured it)."""
    seeds = [r for r in replicates(best) if r.state == State.COMPLETE]
    values = [r.value for r in seeds if finite_or_none(r.value) is not None]
    if len(values) >= 2:
        return mean_and_stderr(values)[1], f"over its {len(values)} seeds"
    if len(seeds) == 1:
        return finite_or_none(seeds[0].stderr), "over its eval problems"
    return None, ""


def stop_reason(
    trials: Sequence[FrozenTrial], maximize: bool, min_trials: int, planned: int, seed: int | None
) -> str | None:
    """Why the search should stop now (one line), or None to go on.

    Only completed configurations count: a pruned one has no value (the health constraint
    already teaches the sampler where runs break), a running one none yet.
    """
    done = [
        t for t in trials if t.state == TrialState.COMPLETE and finite_or_none(t.value) is not None
    ]
    if len(done) < min_trials:
        return None
    best = best_trial(done, maximize)
    noise, over = best_noise(best)
    if noise is None or noise == 0:  # an exact objective: any gain is real, never stop on it
        return None
    direction = StudyDirection.MAXIMIZE if maximize else StudyDirection.MINIMIZE
    try:
        with warnings.catch_warnings():  # RegretBoundEvaluator is marked experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            evaluator = RegretBoundEvaluator(min_n_trials=min_trials, seed=seed)
            bound = evaluator.evaluate(done, direction)
    except ValueError as e:  # e.g. no parameter common to every trial: no fit, so go on
        log.warning("terminator: cannot bound the regret (%s); the study goes on", e)
        return None
    if not math.isfinite(bound) or bound >= noise:
        return None
    return (
        f"stopped after {len(done)} completed configurations of {planned} planned: the best, "
        f"t{best.number} "
        f"({best.value:.4g}), cannot plausibly be beaten by more than its noise (regret bound "
        f"{bound:.3g} < its standard error {over}, {noise:.3g})"
    )


def stop_if_nothing_to_gain(
    study: optuna.Study, s: SweepSettings, planned: int, parent_run_id: str, name: str
) -> None:
    """terminator=true: once the best cannot plausibly be beaten by more than its noise,
    record why on the study (every worker reads it before taking a slot) and its MLflow
    run; configurations already started finish, queued slots stay queued."""
    if not s.terminator or study.user_attrs.get(StudyAttr.STOPPED):
        return
    if not display.Counts.of(study).waiting:  # nothing left to stop
        return
    trials = study.get_trials(deepcopy=False)
    reason = stop_reason(trials, s.maximize, s.terminator_min_trials, planned, s.seed)
    if reason is None:
        return
    study.set_user_attr(StudyAttr.STOPPED, reason)
    runs.set_run_tags(parent_run_id, {Tag.STOPPED: reason})
    say(f"[sweep {name}] {reason}")
