"""Where a trial's eval curve is heading: a predicted final objective with an interval.

Pure (numpy only): the sweep's job asks it at every eval step when
`hydra.sweeper.pruner=forecast` (sweeper/sweep/forecaster.py) and bench/bench_forecast.py replays it
on recorded curves. Two parametric models, each fitted by weighted least squares on the curve
so far (weights 1/stderr^2):

- flat: the curve has settled, the final value is the weighted mean of its last half;
- power: y(s) = a + b (s + 1)^-1/2, a power law in the step that keeps its trend (rising or
  falling) but flattens, so an early climb is not extrapolated as a line.

A sigmoid (ScaleRL's form) has 4 parameters and a curve here has 2-6 eval points: it is not
identified, so it is not fitted. The interval comes from a parametric bootstrap: each eval
value redrawn from N(value, stderr^2), both models refitted, plus the final eval's own noise.
The optimistic forecast is the higher of the two models' upper quantiles, so a trial is cut
only when neither a settled nor a still-moving reading of its curve can reach the incumbent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

DRAWS = 400  # bootstrap redraws: the quantiles at level 0.9 move by < 0.005 beyond this
MIN_STDERR = 0.02  # a mean of 0 (or 1) over problems has stderr 0; noise is never that small
MIN_POINTS = 2  # the baseline and one eval after training started


@dataclass(frozen=True)
class Forecast:
    step: int  # the step it predicts (the run's last)
    mean: float  # the higher of the two models' point forecasts
    high: float  # the optimistic bound at `level` (one-sided)
    level: float

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
) -> Forecast | None:
    """The forecast at `final_step` from the curve so far, or None with too few points."""
    if len(steps) < MIN_POINTS:
        return None
    x = np.asarray(steps, dtype=float)
    y = np.asarray(values, dtype=float)
    se = np.array([max(s or 0.0, MIN_STDERR) for s in stderrs])
    rng = np.random.default_rng(seed)
    draws = y + rng.standard_normal((DRAWS, len(y))) * se
    final_noise = rng.standard_normal(DRAWS) * se[-1]
    means, highs = [], []
    for fit in (flat, power):
        point = fit(x, y, se, final_step)
        spread = np.array([fit(x, d, se, final_step) for d in draws]) + final_noise
        means.append(point)
        highs.append(point + float(np.quantile(spread - spread.mean(), level)))
    return Forecast(final_step, max(means), max(highs), level)


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


def incumbent_low(value: float, stderr: float | None, level: float) -> float:
    """The incumbent's pessimistic final value at `level` (one-sided)."""
    return value - NormalDist().inv_cdf(level) * max(stderr or 0.0, MIN_STDERR)


def cannot_win(fc: Forecast, best_low: float) -> bool:
    """Whether the optimistic forecast stays short of the incumbent's pessimistic value (both
    read as higher-is-better: a minimized objective is negated first)."""
    return fc.high < best_low


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
