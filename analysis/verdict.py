"""The verdict of a sweep: each configuration's mean with its interval, and whether the best
is really better than the runner-up, or tied with it at this sample size.

Read by the sweeper's final table, `python -m analysis report`, the tuned file and the
study's MLflow run, so all of them say the same thing in the same words.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from analysis import stats
from analysis.stats import Interval
from sweeper import records
from sweeper.space import show
from trainer.rl_math import mean_and_stderr


@dataclass(frozen=True)
class Seed:
    seed: int
    value: float | None  # None: this seed was pruned or failed
    stderr: float | None  # the eval's standard error over problems
    per_problem: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Config:
    label: str  # "t2"
    params: dict[str, Any]
    seeds: tuple[Seed, ...]

    @property
    def values(self) -> list[float]:
        return [s.value for s in self.seeds if _finite(s.value)]


@dataclass(frozen=True)
class Summary:
    config: Config
    interval: Interval

    @property
    def label(self) -> str:
        return self.config.label

    @property
    def mean(self) -> float:
        return self.interval.estimate


@dataclass
class Verdict:
    ranked: list[Summary]  # best first
    runner_up_difference: Interval | None  # best minus runner-up (sign: better is positive)
    tied_with_best: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    @property
    def best(self) -> Summary | None:
        return self.ranked[0] if self.ranked else None

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def configs_from_trials(trials: Iterable[FrozenTrial]) -> list[Config]:
    """Completed configurations and their seeds, as the sweep recorded them."""
    out = []
    for t in sorted(trials, key=lambda t: t.number):
        if t.state != TrialState.COMPLETE:
            continue
        seeds = tuple(Seed(r.seed, r.value, r.stderr, r.per_problem) for r in records.replicates(t))
        if not seeds:  # recorded before seeds were: the trial's value alone
            seeds = (Seed(0, t.value, None),)
        out.append(Config(f"t{t.number}", dict(t.params), seeds))
    return out


def summarize(config: Config) -> Summary:
    values = config.values
    if not values:  # every seed pruned or failed: nothing to average
        return Summary(config, stats.Interval(math.nan, math.nan, math.nan, "no completed seed"))
    if len(values) >= 2:
        return Summary(config, stats.t_interval(values))
    stderr = next((s.stderr for s in config.seeds if _finite(s.value)), None)
    return Summary(config, stats.normal_interval(values[0], stderr))


def difference(a: Config, b: Config) -> Interval:
    """a minus b with the sharpest valid interval (see analysis/stats.py)."""
    if len(a.values) >= 2 and len(b.values) >= 2:
        return stats.welch_difference(a.values, b.values)
    pa, pb = _per_problem(a), _per_problem(b)
    if pa is not None and pb is not None and len(pa) == len(pb) and len(pa) >= 2:
        return stats.paired_difference(pa, pb)
    return stats.unpaired_difference(_mean(a), _stderr(a), _mean(b), _stderr(b))


def verdict(configs: Sequence[Config], maximize: bool = True) -> Verdict:
    summaries = [summarize(c) for c in configs if c.values]
    ranked = sorted(summaries, key=lambda s: -s.mean if maximize else s.mean)
    if not ranked:
        return Verdict([], None, lines=["No completed configuration yet: no verdict."])
    best = ranked[0]
    lines = [f"Best: {_describe(best)}."]
    if len(best.config.values) == 1:
        lines.append(
            "With one seed the interval covers the eval's noise only, not run-to-run noise "
            "(hydra.sweeper.seeds=3 measures that)."
        )
    if len(ranked) == 1:
        lines.append("Only one configuration completed: nothing to compare it with.")
        return Verdict(ranked, None, lines=lines)
    sign = 1 if maximize else -1
    runner = ranked[1]
    diff = _signed(difference(best.config, runner.config), sign)
    # A difference with no interval (no stderr logged) is unknown, not a tie.
    gaps = {s.label: _signed(difference(best.config, s.config), sign) for s in ranked[1:]}
    tied = [label for label, gap in gaps.items() if gap.known and not gap.excludes_zero]
    shown = _interval_text(diff)
    if diff.excludes_zero:
        lines.append(
            f"{best.label} beats the runner-up {runner.label} by {diff.estimate:.3g} ({shown})."
        )
    elif diff.known:
        lines.append(
            f"{best.label} and {runner.label} are tied at this sample size (difference "
            f"{diff.estimate:.3g}, {shown}): run more seeds (hydra.sweeper.seeds) or a larger "
            "eval (task.eval_size)."
        )
    else:
        lines.append(f"{best.label} vs {runner.label}: no interval ({diff.method}).")
    if len(tied) > 1:
        lines.append(f"Tied with {best.label} at this sample size: {', '.join(tied)}.")
    return Verdict(ranked, diff, tied, lines)


def interval_cells(summary: Summary | None) -> list[str]:
    """The columns tables show for a configuration: seeds run, mean, 95% CI."""
    if summary is None:
        return ["-", "-", "-"]
    i = summary.interval
    ci = f"{i.low:.3f}-{i.high:.3f}" if i.known else "-"
    return [str(len(summary.config.values)), f"{i.estimate:.4g}", ci]


INTERVAL_HEADER = ["seeds", "mean", "95% CI"]


def _describe(s: Summary) -> str:
    params = show(s.config.params) or "defaults"
    return f"{s.label} ({params}) {s.mean:.4g}, {_interval_text(s.interval)}"


def _interval_text(i: Interval) -> str:
    if not i.known:
        return f"no interval: {i.method}"
    return f"95% CI {i.low:.3g} to {i.high:.3g}, {i.method}"


def _signed(i: Interval, sign: int) -> Interval:
    """A difference turned so that better is positive (minimizing flips it)."""
    if sign == 1:
        return i
    return Interval(-i.estimate, -i.high, -i.low, i.method)


def _per_problem(c: Config) -> list[float] | None:
    seeds = [s for s in c.seeds if _finite(s.value) and s.per_problem]
    return list(seeds[0].per_problem) if len(seeds) == 1 else None


def _mean(c: Config) -> float:
    return sum(c.values) / len(c.values)


def _stderr(c: Config) -> float | None:
    """Seed-to-seed with several seeds, else the one seed's eval stderr."""
    if len(c.values) >= 2:
        return mean_and_stderr(c.values)[1]
    return next((s.stderr for s in c.seeds if _finite(s.value)), None)


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)
