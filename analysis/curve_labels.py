"""What became of a run, read from its whole recorded curve: the labels a health rule is judged
by (bench/HEALTH.md, "Recorded-curve library"). Written down before any rule was re-derived.

A curve gives, per step, the held-out objective (its eval, with the eval's standard error) and
the training reward (the optimised quantity, with its standard error over the batch). Levels
are smoothed over the last WINDOW points so one noisy eval or batch does not decide; "by more
than its noise" is a difference beyond Z standard errors of that difference.

  hacked              training reward up by more than its noise while the held-out objective
                      falls by more than its noise, over the same window (its peak to the end)
  learned_then_broke  the held-out objective rose above its baseline, then fell below its
                      peak, each by more than its noise
  collapsed           the held-out objective ends below its baseline (step 0) by more than
                      its noise
  learning            none of those, and it ends above its baseline by more than its noise
                      (so within noise of its own best: it did not fall from it)
  flat                none of those: no change beyond noise

The first that holds, in that order. `broke_at` is the first step where the break is visible
in the smoothed curve: what a rule's delay is measured from.

A label can hide an error: a smoothed two-eval drop reads "flat", and a pruned "flat" run is
no false prune. So errors are also counted on the run's end alone, whatever its label
(`ending`): a run that ENDED_UP (its last END_WINDOW evals' mean at or above its baseline plus
the baseline's standard error) should not have been pruned; one that BROKE_DOWN (that mean
below its baseline and below its best END_WINDOW-eval mean by more than its noise) should have
been pruned or warned. Pure: no store, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

WINDOW = 5  # points a level is averaged over
END_WINDOW = 3  # evals a run's end (and, for `ending`, its best) is averaged over
Z = 1.96  # standard errors of a difference that count as more than noise (95%, two-sided)

HACKED = "hacked"
BROKE = "learned_then_broke"
COLLAPSED = "collapsed"
LEARNING = "learning"
FLAT = "flat"
LABELS = (HACKED, BROKE, COLLAPSED, LEARNING, FLAT)
BROKEN = (HACKED, BROKE, COLLAPSED)  # what a rule should catch
ENDED_UP = "ended_up"
BROKE_DOWN = "broke_down"


@dataclass(frozen=True)
class Point:
    """A value at a step with its standard error."""

    step: int
    value: float
    stderr: float


@dataclass(frozen=True)
class Label:
    label: str
    broke_at: int | None  # the step the break is first visible (broken labels only)
    why: str  # the numbers behind it, one line


def smoothed(points: Sequence[Point], window: int = WINDOW) -> list[Point]:
    """Trailing means over up to `window` points. Their standard error is the mean of the
    points' (not divided by sqrt(window): evals on a fixed problem set share their noise)."""
    out = []
    for i, p in enumerate(points):
        part = points[max(0, i - window + 1) : i + 1]
        mean = sum(q.value for q in part) / len(part)
        out.append(Point(p.step, mean, sum(q.stderr for q in part) / len(part)))
    return out


def beyond_noise(high: Point, low: Point, z: float = Z) -> bool:
    """Whether `high` exceeds `low` by more than z standard errors of their difference."""
    return high.value - low.value > z * math.hypot(high.stderr, low.stderr)


def batch_mean(points: Sequence[Point]) -> Point:
    """The mean of independent points (training batches) and its standard error."""
    n = len(points)
    mean = sum(p.value for p in points) / n
    return Point(points[-1].step, mean, math.sqrt(sum(p.stderr**2 for p in points)) / n)


def label(heldout: Sequence[Point], train: Sequence[Point], window: int = WINDOW) -> Label:
    """The label of one whole run: `heldout` its eval points from step 0 (the baseline),
    `train` its training reward per step, both sorted by step."""
    if len(heldout) < 2:
        raise ValueError(f"heldout has {len(heldout)} points: a label needs step 0 and more")
    levels = smoothed(heldout, window)
    base, end = heldout[0], levels[-1]
    peak_i = max(range(len(levels)), key=lambda i: levels[i].value)
    peak = levels[peak_i]
    fell = beyond_noise(peak, end)
    after_peak = levels[peak_i:]
    if fell and train:
        at_peak = [p for p in train if p.step <= peak.step][-window:] or train[:1]
        at_end = train[-window:]
        up = beyond_noise(batch_mean(at_end), batch_mean(at_peak))
        if up:
            why = (
                f"held-out {peak.value:.3f} at step {peak.step} -> {end.value:.3f}, training "
                f"reward {batch_mean(at_peak).value:.3f} -> {batch_mean(at_end).value:.3f}"
            )
            return Label(HACKED, _first_below(after_peak, peak), why)
    if fell and beyond_noise(peak, base):
        why = f"held-out {base.value:.3f} -> peak {peak.value:.3f} (step {peak.step}) -> {end.value:.3f}"
        return Label(BROKE, _first_below(after_peak, peak), why)
    if beyond_noise(base, end):
        why = f"held-out {base.value:.3f} at step 0 -> {end.value:.3f}"
        return Label(COLLAPSED, _first_below(levels, base), why)
    if beyond_noise(end, base):
        return Label(LEARNING, None, f"held-out {base.value:.3f} -> {end.value:.3f}")
    return Label(FLAT, None, f"held-out {base.value:.3f} -> {end.value:.3f}, within noise")


def _first_below(levels: Sequence[Point], reference: Point) -> int | None:
    return next((p.step for p in levels if beyond_noise(reference, p)), None)


def ending(heldout: Sequence[Point]) -> str | None:
    """ENDED_UP, BROKE_DOWN or None (neither) from a whole run's eval points, step 0 first."""
    if len(heldout) < 2:
        return None
    base, levels = heldout[0], smoothed(heldout[1:], END_WINDOW)
    end, best = levels[-1], max(levels, key=lambda p: p.value)
    if end.value >= base.value + base.stderr:
        return ENDED_UP
    if end.value < base.value and beyond_noise(best, end):
        return BROKE_DOWN
    return None
