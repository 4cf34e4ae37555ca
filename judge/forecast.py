"""Where a trial's eval curve is heading: a predicted final objective with an interval.

Pure (numpy only): the sweep's job asks it at every eval step when
`hydra.sweeper.pruner=forecast` (sweeper/sweep/forecaster.py) and bench/bench_forecast.py replays it
on recorded curves. Four models of the curve so far (the fitted ones by weighted least
squares, weights 1/stderr^2):

- flat: the curve has settled, the final value is the weighted mean of its last half;
- power: y(s) = a + b (s + 1)^-1/2, a power law in the step that keeps its trend (rising or
  falling) but flattens;
- linear: y(s) = a + b s over the curve's last MIN_PRUNE_POINTS points, the trend kept at its
  recent rate: SmolLM2's best run climbed steadily to its last step, and the two flattening
  models' bound lay under its final value in 0 of 10 forecasts (bench/FORECAST.md);
- peak: the run returns to the best eval training has taken it to (its baseline, the first
  point, left out): RL curves dip and recover, and every forecast the three models above left
  under a calibration run's end at level 0.95 was of a curve that fell and came back
  (bench/FORECAST.md).

A sigmoid (ScaleRL's form) has 4 parameters and a curve here has 2-6 eval points: it is not
identified, so it is not fitted. The interval comes from a parametric bootstrap: each eval
value redrawn from N(value, stderr^2), every model refitted, plus the final eval's own noise.
The optimistic forecast is the highest of the models' upper quantiles, so a trial is cut
only when no reading of its curve (settled, flattening, still climbing, back at its peak)
can reach the incumbent. The bootstrap sees eval noise only; the model's own error is added
as a conformal correction: MODEL_ERROR, at each level the quantile of (final - bound) /
horizon over the forecasts of the calibration curves (bench/bench_forecast.py --calibrate;
horizon: the share of the run still to go), so the bound covers the final value at its level
there. No forecast prunes before MIN_PRUNE_POINTS eval points (cannot_win).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

# The pruner's name (hydra.sweeper.pruner=forecast) and the check its stop records: a stop on
# the forecast is the sweep's judgment of the configuration, not a health breach.
FORECAST = "forecast"


def is_unsafe(breach: Mapping[str, object]) -> bool:
    """Whether a recorded stop marks its configuration unsafe (health_breach, the sampler's
    breach region): a pruning health rule, not a warning or a forecast."""
    return breach.get("check") != FORECAST and breach.get("action", "prune") == "prune"


# The models the optimistic bound is the highest of.
OPTIMISTIC = ("flat", "power", "linear", "peak")
DRAWS = 400  # bootstrap redraws: the quantiles at level 0.9 move by < 0.005 beyond this
MIN_STDERR = 0.02  # a mean of 0 (or 1) over problems has stderr 0; noise is never that small
MIN_POINTS = 2  # the baseline and one eval after training started: a forecast to log
# A forecast may prune from this many eval points on: on two points a slow starter reads as a
# flat curve (SmolLM2's eventual best was pruned at step 2 in 6 of 20 orders, bench/FORECAST.md).
MIN_PRUNE_POINTS = 3
# The conformal correction per unit horizon at each level, from the calibration curves
# (bench/results/health_curves.json, runs that did not collapse; bench/bench_forecast.py
# --calibrate writes it): the bound is raised by MODEL_ERROR[level] x horizon. Linear between
# the levels listed, the last one beyond.
MODEL_ERROR = {0.5: 0.0, 0.75: 0.0, 0.9: 0.0, 0.95: 0.0}


@dataclass(frozen=True)
class Forecast:
    step: int  # the step it predicts (the run's last)
    mean: float  # the higher of the flattening models' point forecasts (CENTRAL)
    high: float  # the optimistic bound at `level` (one-sided)
    level: float
    points: int = 0  # eval points it was made from (cannot_win needs MIN_PRUNE_POINTS)

    def __str__(self) -> str:
        return (
            f"at step {self.step} predicted {self.mean:.3g} "
            f"({100 * self.level:.0f}% to {self.high:.3g})"
        )


def forecast(
    steps: Sequence[int],
    values: Sequence[float],
    stderrs: Sequence[float | None],
    final_step: int,
    level: float = 0.9,
    seed: int = 0,
    models: Sequence[str] = OPTIMISTIC,
    corrected: bool = True,
) -> Forecast | None:
    """The forecast at `final_step` from the curve so far, or None with too few points.
    models and corrected: what the bench compares (the pruner uses the defaults)."""
    if len(steps) < MIN_POINTS:
        return None
    x = np.asarray(steps, dtype=float)
    y = np.asarray(values, dtype=float)
    se = np.array([max(s or 0.0, MIN_STDERR) for s in stderrs])
    rng = np.random.default_rng(seed)
    draws = y + rng.standard_normal((DRAWS, len(y))) * se
    final_noise = rng.standard_normal(DRAWS) * se[-1]
    means, highs = [], []
    for name in models:
        fit = MODELS[name]
        point = fit(x, y, se, final_step)
        spread = np.array([fit(x, d, se, final_step) for d in draws]) + final_noise
        if name in CENTRAL:
            means.append(point)
        highs.append(point + float(np.quantile(spread - spread.mean(), level)))
    horizon = max(final_step - x[-1], 0.0) / final_step if final_step > 0 else 0.0
    error = model_error(level) * horizon if corrected else 0.0
    return Forecast(final_step, max(means), max(highs) + error, level, len(y))


def model_error(level: float) -> float:
    """MODEL_ERROR at `level`, linear between the levels calibrated (never below 0)."""
    known = sorted(MODEL_ERROR.items())
    if level <= known[0][0]:
        return max(known[0][1], 0.0)
    for (l0, e0), (l1, e1) in zip(known, known[1:], strict=False):
        if level <= l1:
            return max(e0 + (e1 - e0) * (level - l0) / (l1 - l0), 0.0)
    return max(known[-1][1], 0.0)


def flat(x: np.ndarray, y: np.ndarray, se: np.ndarray, final_step: int) -> float:
    """The weighted mean of the curve's last half (at least its last point)."""
    half = slice(len(y) // 2, None)
    w = 1 / se[half] ** 2
    return float(np.sum(w * y[half]) / np.sum(w))


def power(x: np.ndarray, y: np.ndarray, se: np.ndarray, final_step: int) -> float:
    """a + b (s + 1)^-1/2 fitted by weighted least squares, read at final_step."""
    basis = np.stack([np.ones_like(x), (x + 1) ** -0.5], axis=1)
    w = 1 / se
    (a, b), *_ = np.linalg.lstsq(basis * w[:, None], y * w, rcond=None)
    return float(a + b * (final_step + 1) ** -0.5)


def linear(x: np.ndarray, y: np.ndarray, se: np.ndarray, final_step: int) -> float:
    """a + b s fitted by weighted least squares on the last MIN_PRUNE_POINTS points (the
    last two while there are only two), read at final_step."""
    tail = slice(-MIN_PRUNE_POINTS, None)
    basis = np.stack([np.ones_like(x[tail]), x[tail]], axis=1)
    w = 1 / se[tail]
    (a, b), *_ = np.linalg.lstsq(basis * w[:, None], y[tail] * w, rcond=None)
    return float(a + b * final_step)


def peak(x: np.ndarray, y: np.ndarray, se: np.ndarray, final_step: int) -> float:
    """The highest eval after the first point (the baseline, before training moved it)."""
    return float(np.max(y[1:]))


MODELS = {"flat": flat, "power": power, "linear": linear, "peak": peak}
# The predicted value (Forecast.mean) is the higher of the models that flatten; a line kept at
# its recent rate and a return to the peak are optimistic readings only (a line passes 1 for
# a climbing reward).
CENTRAL = ("flat", "power")


def incumbent_low(
    value: float,
    stderr: float | None,
    level: float,
    seed_variance: float = 0.0,
    seeds: tuple[int, int] = (1, 1),
) -> float:
    """The incumbent's pessimistic final value at `level` (one-sided), for a configuration's
    forecast to reach: below its mean by its eval's noise and, once the sweep has measured the
    seed-to-seed variance, by the seed noise of the difference between the configuration's
    mean over k seeds and the incumbent's over m (seeds=(k, m)). Without that term, a
    configuration tied with the best whose first seed drew low was stopped against the
    luckiest of several means (the truth's best, in 4-7% of held-out replays: bench/COST.md)."""
    k, m = seeds
    noise = math.hypot(max(stderr or 0.0, MIN_STDERR), math.sqrt(seed_variance * (1 / k + 1 / m)))
    return value - NormalDist().inv_cdf(level) * noise


def cannot_win(fc: Forecast, best_low: float) -> bool:
    """Whether the optimistic forecast stays short of the incumbent's pessimistic value (both
    read as higher-is-better: a minimized objective is negated first); never before
    MIN_PRUNE_POINTS eval points."""
    return fc.points >= MIN_PRUNE_POINTS and fc.high < best_low


def pooled_curve(
    curves: Sequence[Mapping[int, tuple[float, float | None]]], up_to: int
) -> tuple[list[int], list[float], list[float | None]]:
    """A configuration's eval curve over its seeds ({step: (value, stderr)} each), up to step
    `up_to`: at each step some seed reached, the mean over the seeds that reached it and that
    mean's standard error (pooled_stderr)."""
    steps = sorted({s for curve in curves for s in curve if s <= up_to})
    values, stderrs = [], []
    for step in steps:
        here = [curve[step] for curve in curves if step in curve]
        values.append(sum(v for v, _ in here) / len(here))
        stderrs.append(pooled_stderr([e for _, e in here]))
    return steps, values, stderrs


def pooled_stderr(stderrs: Sequence[float | None]) -> float | None:
    """The standard error of a mean over seeds from each seed's own (over problems)."""
    known = [s for s in stderrs if s is not None and math.isfinite(s)]
    if not known:
        return None
    return math.sqrt(sum(s * s for s in known)) / len(known)
