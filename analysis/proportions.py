"""Shares of runs with their 95% intervals: Wilson's for independent runs, a cluster-robust one
for runs that share a seed (or a replay), and how a share is shown in a table."""

from __future__ import annotations

import math
from collections.abc import Mapping

Z95 = 1.959963984540054  # a 95% interval is an estimate +-Z95 standard errors


def wilson(hits: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's 95% interval for a proportion hits/n; (0, 1) when n is 0."""
    if n == 0:
        return 0.0, 1.0
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def clustered_interval(
    clusters: Mapping[str, tuple[int, int]], z: float = Z95
) -> tuple[float, float]:
    """A 95% interval for a share hits/n pooled over clusters {cluster: (hits, n)} whose runs
    are not independent (a seed's runs share problems and draws): the ratio estimator's
    cluster-robust standard error, sqrt(k/(k-1) * sum((h_c - p n_c)^2)) / n, floored at the
    Wilson interval's width (one cluster, or no spread, says little). (0, 1) when n is 0."""
    hits = sum(h for h, _ in clusters.values())
    n = sum(m for _, m in clusters.values())
    if n == 0:
        return 0.0, 1.0
    p, k = hits / n, len(clusters)
    low, high = wilson(hits, n, z)
    if k < 2:
        return low, high
    spread = sum((h - p * m) ** 2 for h, m in clusters.values()) * k / (k - 1)
    half = z * math.sqrt(spread) / n
    return max(0.0, min(low, p - half)), min(1.0, max(high, p + half))


def shown_share(hits: int, n: int, interval: tuple[float, float]) -> str:
    """hits/n with its share and a given 95% interval."""
    if n == 0:
        return "-/0"
    return f"{hits}/{n} {hits / n:.0%} [{interval[0]:.0%}, {interval[1]:.0%}]"


def rate(hits: int, n: int) -> str:
    """hits/n with its share and 95% Wilson interval."""
    return shown_share(hits, n, wilson(hits, n))
