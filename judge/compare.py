"""The one comparison of two configurations: a minus b with its interval, as the race decides
on it (judge/race.py) and the verdict reports it (analysis/verdict.py).

Sharpest valid interval first (judge/stats.py says why each):
  - paired by seed: the blocked fit (configuration + seed) over every configuration with
    MIN_SEEDS values, its residual variance raised to its VARIANCE_BOUND upper bound, then
    moderated toward the pair's own seed-paired variance (blocked.moderated, PRIOR_DF);
  - unpaired, >= 2 seeds each: the pooled seed variance of a raced sweep (raised alike), or
    Welch's t when seeds were not raced;
  - one seed each: per-problem differences on the same problems, else the two eval stderrs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from judge import blocked, stats
from judge.configs import Config
from judge.stats import MIN_SEEDS, Interval, mean_and_stderr


class Judge:
    """Compares configurations of one sweep. raced: seeds were raced (seeds=auto), so an
    unpaired difference uses the seed variance pooled over every configuration (the race's)."""

    def __init__(self, configs: Sequence[Config], raced: bool = True):
        used = [c for c in configs if len(c.values) >= MIN_SEEDS]
        fit = blocked.blocked_fit({c.label: c.by_seed for c in used if c.paired})
        self.fit = blocked.blocked_bound(fit) if fit.df else None
        pool = stats.pooled_variance([c.values for c in used])
        self.pool = stats.variance_bound(pool) if raced else None

    def mean(self, c: Config) -> float:
        """The mean configurations are ranked by: seed-adjusted where paired (read at the seeds
        the others ran, so a raced one's lucky seeds do not count), else the plain mean."""
        adjusted = self.fit.adjusted_mean(c.label) if self.fit is not None else None
        return stats.mean_of(c.values) if adjusted is None else adjusted

    def interval(self, c: Config, level: float = stats.LEVEL) -> Interval:
        """c's mean with its interval over seeds (>= 2): on the raced sweep's pooled seed
        variance, as its differences are judged, else its own t interval."""
        pool = self.pool
        if pool is not None and pool.df and math.isfinite(pool.variance):
            return stats.pooled_mean(c.values, pool, level)
        return stats.t_interval(c.values, level)

    def difference(self, a: Config, b: Config, level: float = stats.LEVEL) -> Interval:
        """a minus b with its interval at `level`."""
        if len(a.values) >= MIN_SEEDS and len(b.values) >= MIN_SEEDS:
            by_seed = self.fit.difference(a.label, b.label, level) if self.fit else None
            if by_seed is not None:
                shared = sorted(set(a.by_seed) & set(b.by_seed))
                own = [a.by_seed[s] - b.by_seed[s] for s in shared]
                return blocked.moderated(by_seed, self.fit.variance, own, level)
            if self.pool is not None:
                out = stats.pooled_difference(a.values, b.values, self.pool, level)
            else:
                out = stats.welch_difference(a.values, b.values, level)
            why = "too few seeds to pair" if set(a.by_seed) & set(b.by_seed) else "seeds not shared"
            return replace(out, method=f"unpaired, {out.method}: {why}")
        pa, pb = _per_problem(a), _per_problem(b)
        if pa is not None and pb is not None and len(pa) == len(pb) and len(pa) >= 2:
            return stats.paired_difference(pa, pb, level)
        return stats.unpaired_difference(_mean(a), _stderr(a), _mean(b), _stderr(b), level)

    def variance(self, diff: Interval) -> stats.Pooled | None:
        """The seed variance behind `diff`, for how many seeds would separate it."""
        if self.fit is not None and diff.method.startswith("paired by seed"):
            return stats.Pooled(self.fit.variance, self.fit.df, len(self.fit.labels))
        return self.pool


def signed(i: Interval, sign: int) -> Interval:
    """A difference turned so that better is positive (minimizing flips it)."""
    if sign == 1:
        return i
    return Interval(-i.estimate, -i.high, -i.low, i.method, i.se, i.df)


def _per_problem(c: Config) -> list[float] | None:
    seeds = [s for s in c.completed if s.per_problem]
    return list(seeds[0].per_problem) if len(seeds) == 1 else None


def _mean(c: Config) -> float:
    return sum(c.values) / len(c.values)


def _stderr(c: Config) -> float | None:
    """Seed-to-seed with several seeds, else the one seed's eval stderr."""
    if len(c.values) >= 2:
        return mean_and_stderr(c.values)[1]
    return next((s.stderr for s in c.completed), None)
