"""The verdict of a sweep: each configuration's mean with its interval, and whether the best
is really better than the runner-up, or tied with it at this sample size.

Read by the sweeper's final table, `python -m analysis report`, the tuned file and the
study's MLflow run, so all of them say the same thing in the same words.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from analysis.text import show
from judge import stats
from judge.stats import Interval, mean_and_stderr
from records.metrics import EVAL_REWARD, is_finite_number
from records.sweep import StudyAttr, TrialAttr, replicates


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
    baseline: float | None = None  # mean eval reward at step 0 over its seeds
    race: str = ""  # seeds=auto: why it got the seeds it got (sweeper/sweep/racing.py)

    @property
    def values(self) -> list[float]:
        return [s.value for s in self.seeds if is_finite_number(s.value)]

    @property
    def by_seed(self) -> dict[int, float]:
        return {s.seed: s.value for s in self.seeds if is_finite_number(s.value)}

    @property
    def eval_stderr(self) -> float | None:
        """The eval's standard error over problems, averaged over the seeds that logged one:
        the baseline's stand-in (the same problems, evaluated at step 0)."""
        known = [s.stderr for s in self.seeds if is_finite_number(s.stderr)]
        return sum(known) / len(known) if known else None


@dataclass(frozen=True)
class Summary:
    config: Config
    interval: Interval
    adjusted: float | None = None  # paired by seed: the seed-adjusted mean the ranking reads

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
        seeds = tuple(Seed(r.seed, r.value, r.stderr, r.per_problem) for r in replicates(t))
        if not seeds:  # recorded before seeds were: the trial's value alone
            seeds = (Seed(0, t.value, None),)
        baseline = t.user_attrs.get(TrialAttr.BASELINE)
        race = t.user_attrs.get(TrialAttr.RACE, "")
        out.append(Config(f"t{t.number}", dict(t.params), seeds, baseline, race))
    return out


def study_verdict(study: optuna.Study | None, attrs: Mapping[str, Any], maximize: bool) -> Verdict:
    """The verdict of a study as stored (none to give when the study is gone); the sweep's
    closing table, the report, its figures and the tuned file all ask this one."""
    trials = study.get_trials(deepcopy=False) if study is not None else []
    return sweep_verdict(trials, attrs, maximize)


def sweep_verdict(
    trials: Iterable[FrozenTrial], study_attrs: Mapping[str, Any], maximize: bool
) -> Verdict:
    """The verdict of a study as recorded: raced seeds compare at the race's level; a study
    the terminator stopped says why it ran fewer trials than planned."""
    configs = configs_from_trials(trials)
    bounds = objective_range(study_attrs.get(StudyAttr.OBJECTIVE, EVAL_REWARD), configs)
    out = verdict(configs, maximize, study_attrs.get(StudyAttr.MAX_SEEDS), bounds)
    stopped = study_attrs.get(StudyAttr.STOPPED)
    if stopped:
        out.lines.append(f"The search {stopped} (hydra.sweeper.terminator=true).")
    return out


def objective_range(objective: str, configs: Sequence[Config]) -> tuple[float, float] | None:
    """(0, 1) for a mean reward whose every recorded value and baseline lies in [0, 1], as
    the built-in rewards' do; None (unbounded) otherwise."""
    if not (objective.startswith("eval/reward") and objective.endswith("/mean")):
        return None
    seen = [v for c in configs for v in (*c.values, c.baseline) if is_finite_number(v)]
    return (0.0, 1.0) if all(0 <= v <= 1 for v in seen) else None


def summarize(config: Config, bounds: tuple[float, float] | None = None) -> Summary:
    """A configuration's mean and interval; bounds: the objective's range, which the interval
    is clipped to (the true mean lies in it, so clipping keeps the coverage: with 2 seeds a t
    interval is wide and would otherwise reach below 0 for a mean of 0/1 rewards)."""
    values = config.values
    if not values:  # every seed pruned or failed: nothing to average
        return Summary(config, stats.Interval(math.nan, math.nan, math.nan, "no completed seed"))
    if len(values) >= 2:
        interval = stats.t_interval(values)
    else:
        stderr = next((s.stderr for s in config.seeds if is_finite_number(s.value)), None)
        interval = stats.normal_interval(values[0], stderr)
    return Summary(config, clipped(interval, bounds))


def clipped(i: Interval, bounds: tuple[float, float] | None) -> Interval:
    if bounds is None or not i.known or (bounds[0] <= i.low and i.high <= bounds[1]):
        return i
    low, high = max(i.low, bounds[0]), min(i.high, bounds[1])
    return replace(
        i, low=low, high=high, method=f"{i.method}, clipped to [{bounds[0]:g}, {bounds[1]:g}]"
    )


def blocked(configs: Sequence[Config]) -> stats.Blocked | None:
    """The configuration + seed fit over every configuration with >= 2 seeds (judge/stats.py
    blocked_fit), its variance raised to its VARIANCE_BOUND upper bound as the race raises
    it: pooled over configurations whose seeds co-move unequally (a collapsing lr's less than
    a learning one's), the plain residual variance covered the truth's difference in 85% of
    fixed seeds=2 replays, raised in 91% (bench/RACING.md)."""
    fit = stats.blocked_fit({c.label: c.by_seed for c in configs})
    if not fit.df:
        return None
    return stats.blocked_bound(fit)


def difference(
    a: Config,
    b: Config,
    level: float = stats.LEVEL,
    pool: stats.Pooled | None = None,
    paired: stats.Blocked | None = None,
) -> Interval:
    """a minus b with the sharpest valid interval (see judge/stats.py): paired by seed
    (paired: the blocked fit over the study's configurations, its variance moderated toward
    the pair's own, stats.moderated) where their seeds connect them,
    else unpaired: pool, the seed variance pooled over a raced study's configurations, or
    Welch's t, for those with >= 2 seeds."""
    if len(a.values) >= 2 and len(b.values) >= 2:
        by_seed = paired.difference(a.label, b.label, level) if paired else None
        if by_seed is not None:
            shared = sorted(set(a.by_seed) & set(b.by_seed))
            own = [a.by_seed[s] - b.by_seed[s] for s in shared]
            return stats.moderated(by_seed, paired.variance, own, level)
        if pool is not None:
            out = stats.pooled_difference(a.values, b.values, pool, level)
        else:
            out = stats.welch_difference(a.values, b.values, level)
        why = "too few seeds to pair" if set(a.by_seed) & set(b.by_seed) else "seeds not shared"
        return replace(out, method=f"unpaired, {out.method}: {why}")
    pa, pb = _per_problem(a), _per_problem(b)
    if pa is not None and pb is not None and len(pa) == len(pb) and len(pa) >= 2:
        return stats.paired_difference(pa, pb, level)
    return stats.unpaired_difference(_mean(a), _stderr(a), _mean(b), _stderr(b), level)


def verdict(
    configs: Sequence[Config],
    maximize: bool = True,
    max_seeds: int | None = None,
    bounds: tuple[float, float] | None = None,
) -> Verdict:
    """max_seeds: the seeds were raced (seeds=auto) up to it; differences then use the
    race's corrected level and its pooled seed variance (sweeper/sweep/racing.py), so the verdict
    decides only what the race decided. bounds: the objective's range (objective_range)."""
    summaries = [summarize(c, bounds) for c in configs if c.values]
    if not summaries:
        return Verdict([], None, lines=["No completed configuration yet: no verdict."])
    paired = blocked([s.config for s in summaries])
    if paired is not None:  # ranked at the same seeds: a raced one's lucky seeds do not count
        summaries = [replace(s, adjusted=paired.adjusted_mean(s.label)) for s in summaries]
    sign = 1 if maximize else -1
    ranked = sorted(summaries, key=lambda s: stats.rank_value(-sign * _rank_value(s)))
    best = ranked[0]
    lines = learned_nothing(ranked, maximize)
    lines.append(f"Best: {_describe(best)}.")
    if len(best.config.values) == 1:
        lines.append(
            "With one seed the interval covers the eval's noise only, not run-to-run noise "
            "(hydra.sweeper.seeds=auto, the default, measures that)."
        )
    if len(ranked) == 1:
        lines.append("Only one configuration completed: nothing to compare it with.")
        return Verdict(ranked, None, lines=lines)
    level = racing_level(max_seeds, len(ranked))
    pool = None
    if max_seeds is not None:  # as the race judged: sweeper/sweep/racing.py spread
        pool = stats.variance_bound(stats.pooled_variance([s.config.values for s in ranked]))
    runner = ranked[1]
    # A difference with no interval (no stderr logged) is unknown, not a tie.
    gaps = {
        s.label: _signed(difference(best.config, s.config, level, pool, paired), sign)
        for s in ranked[1:]
    }
    diff = gaps[runner.label]
    tied = [label for label, gap in gaps.items() if gap.known and not gap.excludes_zero]
    shown = _interval_text(diff, level)
    if diff.excludes_zero:
        lines.append(
            f"{best.label} beats the runner-up {runner.label} by {diff.estimate:.3g} ({shown})."
        )
    elif diff.known:
        lines.append(
            f"{best.label} and {runner.label} are tied at this sample size (difference "
            f"{diff.estimate:.3g}, {shown}): "
            f"{_more_needed(best.config, runner.config, level, max_seeds, _variance(diff, pool, paired))}."
        )
    else:
        lines.append(f"{best.label} vs {runner.label}: no interval ({diff.method}).")
    if len(tied) > 1:
        lines.append(f"Tied with {best.label} at this sample size: {', '.join(tied)}.")
    if max_seeds is not None:
        lines.append(race_line([s.config for s in ranked], max_seeds))
        stopped = [label for label in tied if "eliminated" in _race_of(ranked, label)]
        if stopped:
            lines.append(
                f"{', '.join(stopped)}: eliminated by the race (at its per-look level, "
                f"{stats.look_level(max_seeds, len(ranked)):.2%}, more seeds were unlikely to "
                f"make it the best), yet not decided worse than {best.label} at the verdict's "
                f"{level:.2%}: it got fewer seeds because the race stopped spending on it, "
                "not because it is shown worse."
            )
        short = [label for label in tied if _race_of(ranked, label).startswith("cannot beat")]
        if short:
            lines.append(
                f"{', '.join(short)}: stopped by the race, as even at a "
                f"{stats.FUTILITY_LEVEL:.0%} upper bound beating its leader by "
                "hydra.sweeper.min_difference was out of reach; not decided worse than "
                f"{best.label} at the verdict's {level:.2%}, only given fewer seeds."
            )
    return Verdict(ranked, diff, tied, lines)


def _rank_value(s: Summary) -> float:
    return s.mean if s.adjusted is None else s.adjusted


def _variance(
    diff: Interval, pool: stats.Pooled | None, paired: stats.Blocked | None
) -> stats.Pooled | None:
    """The seed variance behind a difference, for how many seeds would separate it."""
    if paired is not None and diff.method.startswith("paired by seed"):
        return stats.Pooled(paired.variance, paired.df, len(paired.labels))
    return pool


def racing_level(max_seeds: int | None, configurations: int = 2) -> float:
    """The level differences are judged at: when seeds raced, the race's corrected per-look
    level made stricter for calling a difference decided (judge/stats.py decided_level)."""
    return stats.LEVEL if max_seeds is None else stats.decided_level(max_seeds, configurations)


def _race_of(ranked: Sequence[Summary], label: str) -> str:
    return next((s.config.race for s in ranked if s.label == label), "")


def _more_needed(
    a: Config, b: Config, level: float, max_seeds: int | None, pool: stats.Pooled | None = None
) -> str:
    """What it would take to separate two tied configurations."""
    if max_seeds is None or min(len(a.values), len(b.values)) < 2:
        return "run more seeds (hydra.sweeper.seeds) or a larger eval (task.eval_size)"
    need = stats.seeds_to_separate(a.values, b.values, level, pool)
    if not math.isfinite(need):
        return "their means are equal: no number of seeds separates them"
    return (
        f"separating them would take ~{need} seeds each (hydra.sweeper.max_seeds={need}), "
        "or a larger eval (task.eval_size)"
    )


def race_line(configs: Sequence[Config], max_seeds: int) -> str:
    """How many runs each configuration got and why it stopped, best first. The why's headline
    only (before its first colon): the evidence behind it, on the trial's `race` record, its
    MLflow run and the sweep's live line, made this one line unreadable at four configurations."""
    runs = sum(len(c.seeds) for c in configs)
    each = "; ".join(
        f"{c.label} {len(c.seeds)} ({c.race.split(':')[0] or 'no race record'})" for c in configs
    )
    fixed = len(configs) * max_seeds
    return (
        f"Seeds raced (seeds=auto, max_seeds={max_seeds}, each look at "
        f"{stats.look_level(max_seeds, len(configs)):.2%}): {runs} training runs, where max_seeds for every "
        f"configuration would take {fixed}. {each}."
    )


def learned_nothing(ranked: Sequence[Summary], maximize: bool) -> list[str]:
    """First of all, whether anything moved off its baseline. "Learned nothing" only when no
    configuration's interval reaches a gain over its baseline larger than the eval's standard
    error (the baseline's noise); when none excludes its baseline but some interval reaches
    such a gain, the seeds are too few to tell, and nothing is diagnosed."""
    with_baseline = [s for s in ranked if is_finite_number(s.config.baseline) and s.interval.known]
    if not with_baseline or len(with_baseline) < len(ranked):
        return []
    if not all(_holds(s) for s in with_baseline):
        return []  # some configuration moved off its baseline beyond its interval
    sign = 1 if maximize else -1
    top = max(with_baseline, key=lambda s: sign * (s.mean - s.config.baseline))
    gain = top.mean - top.config.baseline
    reach = {s.label: _reach(s, sign) for s in with_baseline}
    wide = [s for s in with_baseline if reach[s.label] > (s.config.eval_stderr or 0.0)]
    if wide:
        w = max(wide, key=lambda s: reach[s.label])
        return [
            f"Too few seeds to tell whether training moved anything: no configuration's interval "
            f"excludes its baseline, yet {w.label}'s reaches {reach[w.label]:.3g} above it "
            f"({_interval_text(w.interval)}); more seeds (hydra.sweeper.seeds) would tell."
        ]
    return [
        f"No configuration moved off its baseline by more than the noise: the largest change is "
        f"{gain:+.3g} ({top.label}, from {top.config.baseline:.4g}), and no interval reaches a "
        f"gain larger than the eval's standard error. {_likely_cause(ranked)}"
    ]


def _holds(s: Summary) -> bool:
    """The configuration's interval holds its baseline."""
    return s.interval.low <= s.config.baseline <= s.interval.high


def _reach(s: Summary, sign: int) -> float:
    """The largest gain over its baseline the configuration's interval allows."""
    edge = s.interval.high if sign == 1 else s.interval.low
    return sign * (edge - s.config.baseline)


def _likely_cause(ranked: Sequence[Summary]) -> str:
    lrs = [s.config.params["lr"] for s in ranked if isinstance(s.config.params.get("lr"), float)]
    where = f" (the largest tried here is {max(lrs):g})" if lrs else ""
    return (
        f"Likely cause: the updates are too small to change this model: lr{where} may be far "
        "below what it needs (lr=auto gives the recommendation for its size), or max_steps too "
        "few. Seeds will not help until something moves."
    )


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
    adjusted = ""
    if s.adjusted is not None and abs(s.adjusted - s.mean) > 1e-9:
        adjusted = f" (seed-adjusted {s.adjusted:.4g}: read at the seeds the others ran)"
    return f"{s.label} ({params}) {s.mean:.4g}{adjusted}, {_interval_text(s.interval)}"


def _interval_text(i: Interval, level: float = stats.LEVEL) -> str:
    if not i.known:
        return f"no interval: {i.method}"
    return f"{level * 100:.4g}% CI {i.low:.3g} to {i.high:.3g}, {i.method}"


def _signed(i: Interval, sign: int) -> Interval:
    """A difference turned so that better is positive (minimizing flips it)."""
    if sign == 1:
        return i
    return Interval(-i.estimate, -i.high, -i.low, i.method)


def _per_problem(c: Config) -> list[float] | None:
    seeds = [s for s in c.seeds if is_finite_number(s.value) and s.per_problem]
    return list(seeds[0].per_problem) if len(seeds) == 1 else None


def _mean(c: Config) -> float:
    return sum(c.values) / len(c.values)


def _stderr(c: Config) -> float | None:
    """Seed-to-seed with several seeds, else the one seed's eval stderr."""
    if len(c.values) >= 2:
        return mean_and_stderr(c.values)[1]
    return next((s.stderr for s in c.seeds if is_finite_number(s.value)), None)
