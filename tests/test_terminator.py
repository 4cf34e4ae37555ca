"""sweeper/sweep/terminator.py on hand-built studies (a real in-memory Optuna storage): which noise the
best configuration's value has, and when the regret bound falls below it."""

from __future__ import annotations

import statistics

import optuna
from optuna.distributions import FloatDistribution

from records.sweep import Replicate, State, replicate_key
from sweeper.sweep.terminator import best_noise, stop_reason


def _study(points: list[tuple[float, list[float]]]) -> optuna.Study:
    """One completed trial per (x, seed values), each seed recorded as a sweep records it."""
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(0))
    for x, values in points:
        study.enqueue_trial({"x": x})  # the point itself, not a sampled one
        trial = study.ask({"x": FloatDistribution(0, 1)})
        for seed, value in enumerate(values):
            record = Replicate(seed, State.COMPLETE, value, 0.04, 1, None, "", None)
            trial.set_user_attr(replicate_key(seed), record.as_attr())
        study.tell(trial, statistics.fmean(values))
    return study


def test_the_noise_is_the_standard_error_over_seeds_else_over_eval_problems():
    study = _study([(0.1, [0.2, 0.3, 0.25]), (0.2, [0.21])])
    over_seeds, one_seed = study.trials
    noise, over = best_noise(over_seeds)
    assert abs(noise - 0.05 / 3**0.5) < 1e-12 and over == "over its 3 seeds"
    assert best_noise(one_seed) == (0.04, "over its eval problems")


def test_a_flat_study_stops_at_min_trials_and_not_before():
    flat = _study([(x, [0.2, 0.3, 0.25]) for x in (0.1, 0.3, 0.5, 0.7, 0.9)])
    assert stop_reason(flat.trials[:4], True, 5, 20, seed=0) is None  # before min_trials
    reason = stop_reason(flat.trials, True, 5, 20, seed=0)
    assert reason.startswith("stopped after 5 completed configurations of 20 planned: the best")
    assert reason.endswith("< its standard error over its 3 seeds, 0.0289)")


def test_an_exact_objective_never_stops_and_a_steep_one_goes_on():
    exact = _study([(x, [0.25, 0.25]) for x in (0.1, 0.3, 0.5, 0.7, 0.9)])
    assert stop_reason(exact.trials, True, 5, 20, seed=0) is None  # zero noise: any gain is real
    steep = _study([(x, [x / 2, x / 2 + 0.001]) for x in (0.1, 0.3, 0.5, 0.7, 0.9)])
    assert stop_reason(steep.trials, True, 5, 20, seed=0) is None  # the best is at the edge
