"""Confidence intervals for a sweep's verdicts, as pure functions on plain numbers.

Three sources of evidence, each with its interval (95% unless asked otherwise):
  - several seeds of a configuration: a t interval over the seed values (run-to-run noise,
    which includes the eval's own);
  - one seed: a normal interval from the eval's standard error over problems (the eval's
    noise only: it cannot see seed-to-seed variation);
  - two configurations: Welch's t on seed values with >= 2 seeds each; with one seed each,
    the paired interval on per-problem differences when both were evaluated on the same
    problems (sharper: a problem's difficulty cancels); else unpaired, from the two stderrs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

from trainer.rl_math import mean_and_stderr

LEVEL = 0.95
FAMILY_LEVEL = LEVEL  # seeds=auto: the level over all looks of one configuration together

# Seeds every configuration gets with seeds=auto before the race may stop it (sweeper/racing.py):
# one seed has no run-to-run variance, so nothing is eliminated on it.
MIN_SEEDS = 2


@dataclass(frozen=True)
class Interval:
    estimate: float  # a mean, or a difference of means
    low: float  # NaN when the data cannot give an interval
    high: float
    method: str  # how the interval was made, said in the verdict

    @property
    def known(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    @property
    def excludes_zero(self) -> bool:
        return self.known and (self.low > 0 or self.high < 0)


def t_quantile(df: float, level: float = LEVEL) -> float:
    return float(stats.t.ppf((1 + level) / 2, df))


def z_quantile(level: float = LEVEL) -> float:
    return float(stats.norm.ppf((1 + level) / 2))


def t_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """mean +- t(n-1) x sd / sqrt(n), over n >= 2 seed values."""
    mean, se = mean_and_stderr(list(values))
    half = t_quantile(len(values) - 1, level) * se
    return Interval(mean, mean - half, mean + half, f"t over {len(values)} seeds")


def normal_interval(mean: float, stderr: float | None, level: float = LEVEL) -> Interval:
    """mean +- z x stderr: one seed, from the eval's standard error over problems."""
    if stderr is None or not math.isfinite(stderr):
        return Interval(mean, math.nan, math.nan, "1 seed, no eval stderr logged")
    half = z_quantile(level) * stderr
    return Interval(mean, mean - half, mean + half, "1 seed, eval stderr")


def welch_difference(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Interval:
    """mean(a) - mean(b) with Welch's t interval (unequal variances), n >= 2 on each side."""
    mean_a, se_a = mean_and_stderr(list(a))
    mean_b, se_b = mean_and_stderr(list(b))
    se = math.hypot(se_a, se_b)
    diff = mean_a - mean_b
    if se == 0:
        return Interval(diff, diff, diff, "Welch t over seeds")
    df = se**4 / (se_a**4 / (len(a) - 1) + se_b**4 / (len(b) - 1))
    half = t_quantile(df, level) * se
    return Interval(diff, diff - half, diff + half, "Welch t over seeds")


def paired_difference(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Interval:
    """mean(a_i - b_i) +- t(P-1) x sd(d) / sqrt(P): the same P problems scored by both."""
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    mean, se = mean_and_stderr(diffs)
    half = t_quantile(len(diffs) - 1, level) * se
    return Interval(mean, mean - half, mean + half, f"paired over {len(diffs)} problems")


def unpaired_difference(
    mean_a: float, se_a: float | None, mean_b: float, se_b: float | None, level: float = LEVEL
) -> Interval:
    """Two single runs without per-problem data: sqrt(se_a^2 + se_b^2), normal."""
    diff = mean_a - mean_b
    if se_a is None or se_b is None or not math.isfinite(se_a + se_b):
        return Interval(diff, math.nan, math.nan, "no stderr logged")
    half = z_quantile(level) * math.hypot(se_a, se_b)
    return Interval(diff, diff - half, diff + half, "unpaired, eval stderrs")


# The race's arithmetic (sweeper/racing.py decides with it; the verdict reports with it).
def look_level(max_seeds: int) -> float:
    """The per-look confidence level: Bonferroni over a configuration's possible looks."""
    looks = max(1, max_seeds - MIN_SEEDS + 1)
    return 1 - (1 - FAMILY_LEVEL) / looks


def seeds_to_separate(a: Sequence[float], b: Sequence[float], level: float) -> float:
    """Seeds each that would make the current difference of means significant at `level`,
    if the means and the pooled spread stayed as they are (inf: no difference to find)."""
    diff = abs(mean_of(a) - mean_of(b))
    spread = math.sqrt((_var(a) + _var(b)) / 2)
    if diff == 0:
        return math.inf
    if spread == 0:
        return MIN_SEEDS
    for n in range(MIN_SEEDS, 1000):
        if t_quantile(2 * n - 2, level) * spread * math.sqrt(2 / n) < diff:
            return n
    return math.inf


def mean_of(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _var(values: Sequence[float]) -> float:
    m = mean_of(values)
    return sum((v - m) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
