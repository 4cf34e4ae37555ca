"""Confidence intervals for a sweep's verdicts, as pure functions on plain numbers.

Three sources of evidence, each with its interval (95% unless asked otherwise):
  - several seeds of a configuration: a t interval over the seed values (run-to-run noise,
    which includes the eval's own);
  - one seed: a normal interval from the eval's standard error over problems (the eval's
    noise only: it cannot see seed-to-seed variation);
  - two configurations: Welch's t on seed values with >= 2 seeds each, or, when several
    configurations were raced, a t interval on the seed-to-seed variance pooled over all of
    them (one-way ANOVA's within-group variance: many more degrees of freedom than two
    2-seed spreads, so a pair whose two draws happen to be close is not trusted on them;
    seed noise is similar across neighbouring configurations); paired by seed whenever the
    configurations share seeds (the sweeper gives every configuration the same seeds, and a
    seed fixes the problems drawn, the sampling noise and the LoRA init, so one seed's runs
    move together: r = 0.90-0.98 across lrs in bench/results/racing_racing-truth-20.json):
    a blocked analysis, an additive model of configuration + seed fitted by least squares
    over every configuration, whose residual variance is the seed-to-seed noise with the
    shared seed effect removed (judge/blocked.py; bench/RACING.md measured it against per-seed
    differences, whose 1 degree of freedom at 2 seeds gives intervals 3x wider); with one
    seed each,
    the paired interval on per-problem differences when both were evaluated on the same
    problems (sharper: a problem's difficulty cancels); else unpaired, from the two stderrs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

LEVEL = 0.95
FAMILY_LEVEL = LEVEL  # seeds=auto: the level over all looks of one configuration together

# Seeds every configuration gets with seeds=auto before the race may stop it (judge/race.py):
# one seed has no run-to-run variance, so nothing is eliminated on it.
MIN_SEEDS = 2

# seeds=auto judges with the pooled seed variance raised to its VARIANCE_BOUND one-sided upper
# confidence bound (variance_bound): a pool of 2-seed spreads has few degrees of freedom, and
# when every configuration happens to draw two close seeds it understates the seed-to-seed
# spread (bench/RACING.md: 3 of 1,200 replays called a truly tied pair decided on such pools).
VARIANCE_BOUND = 0.60
# A raced verdict calls a difference decided only at a level DECIDED_FACTOR times stricter than
# the race's per-look level (decided_level): the race stops spending seeds on a configuration
# at its own level, a claim that one configuration beats another needs more.
DECIDED_FACTOR = 4
# seeds=auto stops a race as futile when even an optimistic difference, |difference| at its
# one-sided FUTILITY_LEVEL upper confidence bound (difference_bound), is below the minimal
# difference that counts, or when that minimal difference itself could not be separated within
# max_seeds (issue 72; before it, the optimistic difference had to be unseparable too, which at
# 2 seeds kept nearly every pair racing). Never on two seeds' observed difference alone: it is
# mostly noise, and judging futility on it abandoned real differences.
# The same bound stops a configuration that could not beat the leader by the minimal difference
# (reversal_bound): a futility stop, which a verdict's error rate does not spend.
FUTILITY_LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    estimate: float  # a mean, or a difference of means
    low: float  # NaN when the data cannot give an interval
    high: float
    method: str  # how the interval was made, said in the verdict
    se: float = math.nan  # a difference's standard error and degrees of freedom, where a t
    df: float = math.nan  # interval made it (the race's futility bound reads them)

    @property
    def known(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    @property
    def excludes_zero(self) -> bool:
        return self.known and (self.low > 0 or self.high < 0)


def mean_and_stderr(values: list[float]) -> tuple[float, float]:
    """Mean and its standard error (an eval's `<metric>/stderr` over its problems, a mean over
    seeds), sd / sqrt(n) with the n-1 (sample) sd; 0 for one value."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(variance / n)


def rank_value(value: float) -> float:
    """A mean as rankings compare it: rounded past a fit's float noise, so configurations tied
    exactly stay in label order on every CPU (a blocked fit's last bits differ by machine)."""
    return round(value, 12)


def _scipy_stats():
    """scipy.stats, imported where a quantile is first needed: 0.8 s that a trial's start and
    a bad input's one-line error need not pay."""
    from scipy import stats

    return stats


def t_quantile(df: float, level: float = LEVEL) -> float:
    return float(_scipy_stats().t.ppf((1 + level) / 2, df))


def z_quantile(level: float = LEVEL) -> float:
    return float(_scipy_stats().norm.ppf((1 + level) / 2))


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


@dataclass(frozen=True)
class Pooled:
    """Seed-to-seed variance pooled over configurations (one-way ANOVA within groups)."""

    variance: float
    df: int  # sum over the configurations of (seeds - 1)
    groups: int  # configurations with >= 2 seeds that contributed
    bound: float = 0.0  # > 0: the variance is raised to this one-sided upper confidence bound


def pooled_variance(groups: Sequence[Sequence[float]]) -> Pooled:
    """sum_i sum_j (x_ij - mean_i)^2 / sum_i (n_i - 1), over the groups with n_i >= 2."""
    used = [list(g) for g in groups if len(g) >= 2]
    squares = sum(sum((v - sum(g) / len(g)) ** 2 for v in g) for g in used)
    df = sum(len(g) - 1 for g in used)
    return Pooled(squares / df if df else math.nan, df, len(used))


def pooled_difference(
    a: Sequence[float], b: Sequence[float], pooled: Pooled, level: float = LEVEL
) -> Interval:
    """mean(a) - mean(b) +- t(df) x sqrt(s_pooled^2 (1/n_a + 1/n_b)): the pooled-variance t."""
    diff = sum(a) / len(a) - sum(b) / len(b)
    raised = f", variance at its {pooled.bound:.0%} upper bound" if pooled.bound else ""
    method = f"pooled t over seeds ({pooled.groups} configurations, df {pooled.df}{raised})"
    if not pooled.df or not math.isfinite(pooled.variance):
        return Interval(diff, math.nan, math.nan, method)
    se = math.sqrt(pooled.variance * (1 / len(a) + 1 / len(b)))
    half = t_quantile(pooled.df, level) * se
    return Interval(diff, diff - half, diff + half, method, se, pooled.df)


def pooled_mean(values: Sequence[float], pooled: Pooled, level: float = LEVEL) -> Interval:
    """mean +- t(df) x sqrt(s_pooled^2 / n): one configuration's mean on the seed variance of a
    raced sweep, the one its comparisons use (a 2-seed t interval has 1 df: 12.7 x its se)."""
    mean = sum(values) / len(values)
    raised = f", variance at its {pooled.bound:.0%} upper bound" if pooled.bound else ""
    method = f"pooled t over seeds ({pooled.groups} configurations, df {pooled.df}{raised})"
    se = math.sqrt(pooled.variance / len(values))
    half = t_quantile(pooled.df, level) * se
    return Interval(mean, mean - half, mean + half, method, se, pooled.df)


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


def detectable_difference(sd: float, problems: int, level: float = LEVEL) -> float:
    """The smallest difference of two configurations' eval means, each over `problems`
    problems whose rewards spread by `sd`, that an interval at `level` tells from zero:
    z x sd x sqrt(2 / problems) (the eval's noise alone; seeds add their own)."""
    return _normal_z(level) * sd * math.sqrt(2 / problems)


def problems_to_detect(difference: float, sd: float, level: float = LEVEL) -> int:
    """Eval problems at which detectable_difference falls to `difference`."""
    return math.ceil(2 * (_normal_z(level) * sd / difference) ** 2)


# An eval too small for its sweep, said before the first trial (sweeper/plan/eval_power.py)
# and in the verdict's next step (analysis/next_step.py), in the same numbers. The reward's own
# spread is not known before the first trial: the widest a reward in [0, 1] has stands in.
WIDEST_SD = 0.5  # a reward in [0, 1] when half the problems score 0, half 1
# The difference a sweep looks for when hydra.sweeper.min_difference does not say: a fifth of
# a 0-1 reward. Settings of one sweep rarely differ by more; an eval that cannot see this much
# cannot tell any two of them apart.
LOOKED_FOR = 0.2


def problems_short(problems: int, looked_for: float | None = None) -> int | None:
    """The eval problems it takes to tell apart `looked_for` (min_difference; None or 0:
    LOOKED_FOR) when `problems` are too few, else None. More seeds cannot make up for it:
    every seed scores the same problems."""
    looked_for = looked_for or LOOKED_FOR
    if detectable_difference(WIDEST_SD, problems) <= looked_for:
        return None
    return problems_to_detect(looked_for, WIDEST_SD)


def _normal_z(level: float) -> float:
    # statistics.NormalDist, not scipy: a sweep says this before any trial, in the plan stage
    return statistics.NormalDist().inv_cdf((1 + level) / 2)


# The race's arithmetic (judge/race.py decides with it; the verdict reports with it).
def look_level(max_seeds: int, configurations: int = 2) -> float:
    """The per-look confidence level: Bonferroni over a configuration's possible looks and
    over the configurations - 1 comparisons with the leader a verdict makes."""
    looks = max(1, max_seeds - MIN_SEEDS + 1) * max(1, configurations - 1)
    return 1 - (1 - FAMILY_LEVEL) / looks


def variance_bound(pooled: Pooled, bound: float = VARIANCE_BOUND) -> Pooled:
    """The pooled variance raised to its one-sided `bound` upper confidence limit,
    s^2 x df / chi2(1 - bound, df): a variance estimated on df degrees of freedom is below the
    true one with probability `bound` once raised so (normal seeds). The t quantile already
    widens the interval for an uncertain variance; this also protects against the pools that
    replays showed to be deflated (every configuration drawing two close seeds)."""
    if not pooled.df or not math.isfinite(pooled.variance):
        return pooled
    raised = pooled.variance * pooled.df / float(_scipy_stats().chi2.ppf(1 - bound, pooled.df))
    return Pooled(raised, pooled.df, pooled.groups, bound)


def decided_level(max_seeds: int, configurations: int = 2) -> float:
    """The level at which a raced verdict calls a difference decided: the per-look level
    (look_level) with its error rate divided by DECIDED_FACTOR."""
    return 1 - (1 - look_level(max_seeds, configurations)) / DECIDED_FACTOR


def difference_bound(diff: Interval, level: float = FUTILITY_LEVEL) -> float:
    """|difference| + t(df, one-sided level) x its standard error: the largest difference the
    seeds so far make plausible (inf when there is no spread to judge by)."""
    return abs(diff.estimate) + _one_sided_margin(diff, level)


def reversal_bound(diff: Interval, level: float = FUTILITY_LEVEL) -> float:
    """-difference + t(df, one-sided level) x its standard error: for a difference a - b, the
    most b can plausibly be better than a by (inf when there is no spread to judge by)."""
    return -diff.estimate + _one_sided_margin(diff, level)


def _one_sided_margin(diff: Interval, level: float) -> float:
    if not (diff.df > 0 and math.isfinite(diff.se)):
        return math.inf
    return float(_scipy_stats().t.ppf(level, diff.df)) * diff.se


def seeds_to_separate(
    a: Sequence[float],
    b: Sequence[float],
    level: float,
    pool: Pooled | None = None,
    difference: float | None = None,
) -> float:
    """Seeds each that would make a difference of means significant at `level` if the pooled
    spread stayed as it is (inf: no difference to find).

    difference: the difference to separate (default: the current one, |mean(a) - mean(b)|).
    pool: the race's pooled variance (default: pooled over a and b alone); the degrees of
    freedom grow by the seeds a and b would add."""
    pool = pool or pooled_variance([a, b])
    diff = abs(mean_of(a) - mean_of(b)) if difference is None else difference
    if diff == 0 or not math.isfinite(diff):
        return math.inf if diff == 0 else MIN_SEEDS
    if not pool.variance:
        return MIN_SEEDS
    sd = math.sqrt(pool.variance)
    for n in range(MIN_SEEDS, 1000):
        df = pool.df + max(0, n - len(a)) + max(0, n - len(b))
        if t_quantile(max(df, 1), level) * sd * math.sqrt(2 / n) < diff:
            return n
    return math.inf


def mean_of(values: Sequence[float]) -> float:
    return sum(values) / len(values)
