"""The verdict of a sweep, in three parts: the decision in one line (a best that beat every
other; a group tied at this sample size, with what would separate them; nothing learned; every
run broke), the table, and one line of what to run next. The statistics behind it (levels,
pairing, moderation, degrees of freedom) are its `detail`: the HTML report, the study's MLflow
run description and `hydra.verbose=true` show them.

What to run next is analysis/next_step.py's: before more seeds, a cause seeds cannot fix
that the study recorded (truncation, no learning signal, an eval too small).

The comparison is the judge's (judge/compare.py), the one the race decided on; a raced
configuration's stop is the race's decision, printed as the race made it. Read by the sweeper's
final table, `python -m analysis report`, the tuned file and the study's MLflow run, so all of
them say the same thing in the same words.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from analysis.next_step import (
    BROKE,
    Cause,
    Evidence,
    cause_of,
    evidence_of,
    learned_nothing,
    more_needed,
    reuse,
)
from analysis.text import interval_text, show
from judge import stats
from judge.compare import Judge, signed
from judge.configs import (
    Config,
    Seed,
    break_floor,
    configs_from_trials,
    objective_range,
)
from judge.configs import broke as seed_broke
from judge.edge import Setting, away_from_edge, broken_neighbour
from judge.race import CANNOT_BEAT, ELIMINATED
from judge.stats import Interval
from records.metrics import EVAL_REWARD, is_finite_number
from records.sweep import StudyAttr, best_trial, replicates

__all__ = [
    "Config",
    "Seed",
    "configs_from_trials",
    "objective_range",
]  # the judge's, read here by callers


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
    decision: str = ""  # the first line: what the sweep found, with its one number and interval
    next_step: str = ""  # what to run next, one line
    detail: list[str] = field(default_factory=list)  # the statistics behind the decision
    cause: Cause | None = None  # why more seeds would not tell, when the study recorded it

    @property
    def best(self) -> Summary | None:
        return self.ranked[0] if self.ranked else None

    @property
    def lines(self) -> list[str]:
        """The decision, what to run next, then the detail."""
        return [line for line in (self.decision, self.next_step, *self.detail) if line]

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def study_verdict(study: optuna.Study | None, attrs: Mapping[str, Any], maximize: bool) -> Verdict:
    """The verdict of a study as stored (none to give when the study is gone); the sweep's
    closing table, the report, its figures and the tuned file all ask this one."""
    trials = study.get_trials(deepcopy=False) if study is not None else []
    return sweep_verdict(trials, attrs, maximize, study.study_name if study is not None else None)


def sweep_verdict(
    trials: Iterable[FrozenTrial],
    study_attrs: Mapping[str, Any],
    maximize: bool,
    study: str | None = None,
    edge: bool = True,
) -> Verdict:
    """The verdict of a study as recorded: raced seeds compare at the race's level; a study
    the terminator stopped says why it ran fewer trials than planned. study: its name, for
    the tuned file the next step points to. edge: among those tied, name one away from the
    edge of stability (judge/edge.py; False only for bench/bench_cost.py's comparison)."""
    trials = list(trials)
    objective = study_attrs.get(StudyAttr.OBJECTIVE, EVAL_REWARD)
    floor = break_floor(objective, maximize, trials)
    configs = configs_from_trials(trials, floor)
    judged = {c.label for c in configs}
    # configurations left out of the comparison whose seeds broke still mark the edge
    uncounted = [
        Setting(f"t{t.number}", dict(t.params), True)
        for t in trials
        if f"t{t.number}" not in judged and any(seed_broke(r) for r in replicates(t))
    ]
    broken = sum(t.state in (TrialState.PRUNED, TrialState.FAIL) for t in trials)
    bounds = objective_range(objective, [v for c in configs for v in (*c.values, c.baseline)])
    max_seeds = study_attrs.get(StudyAttr.MAX_SEEDS)
    evidence = evidence_of(trials, study_attrs)
    out = verdict(
        configs, maximize, max_seeds, bounds, broken, study, evidence, uncounted if edge else None
    )
    stopped = study_attrs.get(StudyAttr.STOPPED)
    if stopped:
        out.next_step += f" The search {stopped} (hydra.sweeper.terminator=true)."
    return out


def named_trial(
    trials: Sequence[FrozenTrial], named: Verdict, maximize: bool
) -> FrozenTrial | None:
    """The trial the verdict names best (its tie rule included): the one the tuned file, the
    report and the study's MLflow run hold; the best completed value when it names none."""
    if named.best is not None:
        label = named.best.label
        found = next((t for t in trials if f"t{t.number}" == label), None)
        if found is not None and found.state == TrialState.COMPLETE:
            return found
    return best_trial(trials, maximize)


def summarize(
    config: Config, bounds: tuple[float, float] | None = None, judge: Judge | None = None
) -> Summary:
    """A configuration's mean and interval; bounds: the objective's range, which the interval
    is clipped to (the true mean lies in it, so clipping keeps the coverage: with 2 seeds a t
    interval is wide and would otherwise reach below 0 for a mean of 0/1 rewards). judge: the
    sweep's comparison, whose seed variance a raced sweep's intervals use."""
    values = config.values
    if not values:  # every seed pruned or failed: nothing to average
        return Summary(config, stats.Interval(math.nan, math.nan, math.nan, "no completed seed"))
    if len(values) >= 2:
        interval = judge.interval(config) if judge is not None else stats.t_interval(values)
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


def verdict(
    configs: Sequence[Config],
    maximize: bool = True,
    max_seeds: int | None = None,
    bounds: tuple[float, float] | None = None,
    broken: int = 0,
    study: str | None = None,
    evidence: Evidence | None = None,
    left_out: Sequence[Setting] | None = (),
) -> Verdict:
    """max_seeds: the seeds were raced (seeds=auto) up to it; differences then use the race's
    comparison (judge/compare.py, its pooled seed variance) at a level stricter than the
    race's per-look one (stats.decided_level), so the verdict claims only what the race could.
    bounds: the objective's range (objective_range). broken: configurations that ended pruned
    or failed. study: its name (the tuned file). evidence: what the trials recorded beside
    their values (analysis/next_step.py; None: only what the configurations hold). left_out:
    configurations not in `configs` whose seeds broke: with the configurations' own breaks,
    they mark the edge of stability (judge/edge.py); None: the top-ranked is named regardless."""
    evidence = evidence or Evidence()
    judge = Judge([c for c in configs if c.values], raced=max_seeds is not None)
    summaries = [summarize(c, bounds, judge) for c in configs if c.values]
    if not summaries or all(c.broke == len(c.seeds) for c in configs):  # none, or floors only
        if broken:
            return Verdict(
                [],
                None,
                decision=f"Every run broke: all {broken} configurations were pruned or failed, "
                "so nothing is compared.",
                next_step=BROKE,
            )
        return Verdict([], None, decision="No completed configuration yet: no verdict.")
    if judge.fit is not None:  # ranked at the same seeds: a raced one's lucky seeds do not count
        summaries = [replace(s, adjusted=judge.fit.adjusted_mean(s.label)) for s in summaries]
    sign = 1 if maximize else -1
    ranked = sorted(summaries, key=lambda s: stats.rank_value(-sign * _rank_value(s)))
    level = racing_level(max_seeds, len(ranked))
    at_edge = ""
    if left_out is not None:
        ranked, at_edge = _away_from_edge(ranked, judge, level, sign, left_out)
    best = ranked[0]
    detail = [f"Best: {_describe(best)}."]
    if any(c.broke for c in configs):
        detail.append(
            "A seed a health rule stopped counts at the objective's floor: a run that broke "
            "ends near it, and the mean over seeds counts it as a run that came to nothing."
        )
    if len(best.config.values) == 1:
        detail.append(
            "With one seed the interval covers the eval's noise only, not run-to-run noise "
            "(hydra.sweeper.seeds=auto, the default, measures that)."
        )
    nothing = learned_nothing(ranked, maximize, cause_of([s.config for s in ranked], evidence))
    if len(ranked) == 1:
        out = Verdict(
            ranked,
            None,
            decision=f"Only {best.label} completed: mean {_one_number(best)}; nothing to "
            "compare it with.",
            next_step=reuse(best.label, study),
            detail=detail,
        )
        return _nothing_first(out, nothing)
    gaps = _gaps(ranked, judge, level, sign)
    # A configuration with seeds that broke is no alternative to the best, whatever its
    # interval: more seeds would not make it one. It is ranked, and named apart.
    broke = [s.label for s in ranked[1:] if s.config.broke]
    runner = next((s for s in ranked[1:] if s.label not in broke), ranked[1])
    diff = gaps[runner.label]
    tied = _tied(ranked, gaps)
    for s in ranked[1:]:
        detail.append(
            f"{best.label} - {s.label}: {gaps[s.label].estimate:.3g}, "
            f"{interval_text(gaps[s.label], level)}."
        )
    # The race's decisions, as it made them: a configuration it stopped as unable to beat its
    # leader by the difference that counts is not tied with the best, only not worth seeds.
    cannot = [label for label in tied if _race_of(ranked, label).startswith(CANNOT_BEAT)]
    eliminated = [label for label in tied if _race_of(ranked, label).startswith(ELIMINATED)]
    group = [label for label in tied if label not in cannot and label not in eliminated]
    unknown = [label for label, gap in gaps.items() if not gap.known and label not in broke]
    cause = None
    if group or unknown:
        names = _names([best.label, *group, *unknown])
        mate = ranked[[s.label for s in ranked].index((group or unknown)[0])]
        together = [s.config for s in ranked if s.label in {best.label, *group, *unknown}]
        cause = cause_of(together, evidence)
        separate, next_step = more_needed(
            best.config, mate.config, level, max_seeds, judge.variance(gaps[mate.label]), cause
        )
        decision = (
            f"Tied at this sample size: {names}; best {best.label} {_one_number(best)}; {separate}."
        )
        if not group:  # only differences without an interval
            decision = (
                f"Not decided: {names} (best mean {best.label} {_one_number(best)}); no interval "
                f"for {_names(unknown)} ({gaps[unknown[0]].method})."
            )
    else:
        params = show(best.config.params) or "defaults"
        apart = {*cannot, *eliminated, *broke}
        shown = [label for label in gaps if label not in apart]
        if len(broke) == len(gaps):  # every other broke: named below
            decision = f"{best.label} ({params}) is the best: mean {_one_number(best)}."
        elif not cannot and not eliminated:
            how = (
                f"beat every other, {runner.label} by {diff.estimate:.3g} "
                f"({level * 100:.4g}% CI {diff.low:.3g} to {diff.high:.3g})"
            )
            decision = f"{best.label} ({params}) {how}: mean {_one_number(best)}."
        elif cannot:  # none shown better or worse, but none can beat it by what counts
            worse = [*shown, *eliminated]
            also = f"; {_names(worse)} worse" if worse else ""
            who = "no other can" if not worse else f"{_names(cannot)} cannot"
            decision = (
                f"{best.label} ({params}) is as good as any: {who} beat it by "
                f"min_difference{also}; mean {_one_number(best)}."
            )
        else:
            parts = [
                f"{_names(shown)} shown worse" if shown else "",
                f"{_names(eliminated)} stopped by the race as worse",
            ]
            how = "is the best; " + ", ".join(p for p in parts if p)
            decision = f"{best.label} ({params}) {how}: mean {_one_number(best)}."
        next_step = reuse(best.label, study)
    if broke:
        decision += f" {_names(broke)}: seeds broke (counted at the floor)."
    decision += at_edge
    if max_seeds is not None:
        detail.append(race_line([s.config for s in ranked], max_seeds))
        if eliminated:
            detail.append(
                f"{', '.join(eliminated)}: eliminated by the race (at its per-look level, "
                f"{stats.look_level(max_seeds, len(ranked)):.2%}, more seeds were unlikely to "
                f"make it the best), yet not decided worse than {best.label} at the verdict's "
                f"{level:.2%}: it got fewer seeds because the race stopped spending on it, "
                "not because it is shown worse."
            )
        if cannot:
            detail.append(
                f"{', '.join(cannot)}: stopped by the race, as even at a "
                f"{stats.FUTILITY_LEVEL:.0%} upper bound beating its leader by "
                "hydra.sweeper.min_difference was out of reach; not decided worse than "
                f"{best.label} at the verdict's {level:.2%}, only given fewer seeds."
            )
    out = Verdict(ranked, diff, tied, decision, next_step, detail, cause)
    return _nothing_first(out, nothing)


def _gaps(ranked: Sequence[Summary], judge: Judge, level: float, sign: int) -> dict[str, Interval]:
    """The first of `ranked` minus each other, better positive, at `level`."""
    best = ranked[0]
    return {
        s.label: signed(judge.difference(best.config, s.config, level), sign) for s in ranked[1:]
    }


def _tied(ranked: Sequence[Summary], gaps: Mapping[str, Interval]) -> list[str]:
    """Those not separated from the first of `ranked`. A difference with no interval (no stderr
    logged) is unknown, not a tie; a configuration with seeds that broke is no alternative to
    the best, whatever its interval."""
    broke = {s.label for s in ranked if s.config.broke}
    return [
        label
        for label, gap in gaps.items()
        if gap.known and not gap.excludes_zero and label not in broke
    ]


def _away_from_edge(
    ranked: list[Summary], judge: Judge, level: float, sign: int, left_out: Sequence[Setting]
) -> tuple[list[Summary], str]:
    """The ranking with the best named away from the edge of stability (judge/edge.py): when
    the top sits next to a configuration whose seeds broke, the first of those the verdict
    cannot separate from it (and the race did not stop) that does not comes first. Also the
    sentence that says so. left_out: configurations not ranked whose seeds broke."""
    race = {s.label: s.config.race for s in ranked}
    tied = [
        label
        for label in _tied(ranked, _gaps(ranked, judge, level, sign))
        if not race[label].startswith((CANNOT_BEAT, ELIMINATED))  # the race stopped it
    ]
    top = ranked[0]
    everyone = [Setting(s.label, s.config.params, bool(s.config.broke)) for s in ranked]
    everyone += left_out
    pick = away_from_edge([top.label, *tied], everyone)
    if pick is None:
        return ranked, ""
    near = broken_neighbour(everyone[0], everyone)
    note = (
        f" {pick} is named over {top.label} ({show(top.config.params)}), which ranks higher "
        f"but sits next to {near.label} ({show(near.params)}), where seeds broke."
    )
    return [s for s in ranked if s.label == pick] + [s for s in ranked if s.label != pick], note


def _nothing_first(out: Verdict, nothing: tuple[str, str, str, Cause | None] | None) -> Verdict:
    """Nothing learned (or too few seeds to tell) comes before any ranking: its decision and
    next step replace the ranking's, which moves to the detail."""
    if nothing is None:
        return out
    decision, next_step, why, cause = nothing
    out.detail = [why, out.decision, *out.detail]
    out.decision, out.next_step, out.cause = decision, next_step, cause
    return out


def _one_number(s: Summary) -> str:
    """A configuration's mean and 95% interval, with its seeds: the decision's one number."""
    i, n = s.interval, len(s.config.values)
    seeds = f"{n} seed{'s' * (n != 1)}" + (f", {s.config.broke} broke" if s.config.broke else "")
    if not i.known:
        return f"{s.mean:.3g}, no interval, {seeds}"
    return f"{s.mean:.3g}, 95% CI {i.low:.3g} to {i.high:.3g}, {seeds}"


def _names(labels: Sequence[str], most: int = 4) -> str:
    """t0, t1 and t2; past `most`, the first ones and how many more."""
    if len(labels) > most:
        return f"{', '.join(labels[:most])} and {len(labels) - most} more"
    if len(labels) == 1:
        return labels[0]
    return f"{', '.join(labels[:-1])} and {labels[-1]}"


def _rank_value(s: Summary) -> float:
    return s.mean if s.adjusted is None else s.adjusted


def racing_level(max_seeds: int | None, configurations: int = 2) -> float:
    """The level differences are judged at: when seeds raced, the race's corrected per-look
    level made stricter for calling a difference decided (judge/stats.py decided_level)."""
    return stats.LEVEL if max_seeds is None else stats.decided_level(max_seeds, configurations)


def _race_of(ranked: Sequence[Summary], label: str) -> str:
    return next((s.config.race for s in ranked if s.label == label), "")


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


def interval_cells(summary: Summary | None) -> list[str]:
    """The columns tables show for a configuration: seeds run, mean, 95% CI."""
    if summary is None:
        return ["-", "-", "-"]
    i, c = summary.interval, summary.config
    ci = f"{i.low:.3f}-{i.high:.3f}" if i.known else "-"
    seeds = f"{len(c.values)}" + (f" ({c.broke} broke)" if c.broke else "")
    return [seeds, f"{i.estimate:.4g}", ci]


INTERVAL_HEADER = ["seeds", "mean", "95% CI"]


def _describe(s: Summary) -> str:
    params = show(s.config.params) or "defaults"
    adjusted = ""
    if s.adjusted is not None and abs(s.adjusted - s.mean) > 1e-9:
        adjusted = f" (seed-adjusted {s.adjusted:.4g}: read at the seeds the others ran)"
    return f"{s.label} ({params}) {s.mean:.4g}{adjusted}, {interval_text(s.interval)}"
