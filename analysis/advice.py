"""Rules of thumb -> "what to try next".

Each rule reads the study's records and returns advice or None. The rules come from the
practitioners' notes the project started from: an unstable run shows up as sampler-vs-
learner or post-update KL over ~0.01 (lower the learning rate or the substeps); groups whose rollouts all
score the same carry no gradient signal (bigger groups, or a task of the right difficulty);
a baseline of 0% or 80%+ means the task does not fit the model; a best value at the edge of
its range says the range should go further.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import mean, median

from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from analysis.load import StudyData, TrialRecord
from analysis.next_step import MORE_SIGNAL
from analysis.verdict import study_verdict
from judge.forecast import FORECAST, is_unsafe
from records.metrics import GROUPS_ALL_BAD, GROUPS_ALL_GOOD, GROUPS_MIXED, is_finite_number
from records.sweep import StudyAttr

KL_PRUNED_SHARE = 0.5  # "most trials pruned as unstable"
LOW_FRAC_MIXED = 0.3  # under this share of groups with mixed rewards, signal is scarce
BASELINE_TOO_HARD = 0.02
BASELINE_TOO_EASY = 0.8
EDGE_SHARE = 0.1  # within 10% of a range's width (log width on a log scale) of a bound


@dataclass(frozen=True)
class Advice:
    title: str  # what to do, one line
    why: str  # the evidence from this study


Rule = Callable[[StudyData], "Advice | list[Advice] | None"]


def health_pruning(data: StudyData) -> Advice | None:
    """Most trials broke: say which health rule fired most and what it advises. A forecast's
    stop is not a breakage (forecast_stops says it)."""
    finished = data.by_state("complete", "pruned", "failed")
    breaches = [
        t.prune_reason
        for t in data.by_state("pruned")
        if t.prune_reason and is_unsafe(t.prune_reason)
    ]
    if not finished or len(breaches) / len(finished) < KL_PRUNED_SHARE:
        return None
    by_rule: dict[str, list[dict]] = {}
    for breach in breaches:
        by_rule.setdefault(str(breach.get("rule")), []).append(breach)
    rule, fired = max(by_rule.items(), key=lambda kv: len(kv[1]))
    advice = fired[0].get("advice") or "make the updates smaller"
    swept = [p for p in ("lr", "num_substeps") if p in data.param_names]
    where = f"; shift the swept range of {' and '.join(swept)} down" if swept else ""
    steps = sorted(b.get("step") for b in fired if isinstance(b.get("step"), int))
    return Advice(
        f"{advice[0].upper()}{advice[1:]}{where}",
        f"{len(breaches)} of {len(finished)} finished trials were pruned as unstable; the "
        f"{rule} rule fired for {len(fired)} of them ({fired[0].get('metric')} past "
        f"{fired[0].get('bound')}, at steps {', '.join(map(str, steps)) or '?'}). A KL penalty "
        "(kl_penalty_coef 0.01-0.1) also holds updates back.",
    )


def forecast_stops(data: StudyData) -> Advice | None:
    """Trials the forecasting pruner stopped: they could not win, which is no instability."""
    stopped = [
        t for t in data.by_state("pruned") if (t.prune_reason or {}).get("check") == FORECAST
    ]
    if not stopped:
        return None
    shown = ", ".join(f"t{t.number}" for t in stopped[:6])
    return Advice(
        f"{len(stopped)} trial(s) stopped by forecast: could not beat the best",
        f"{shown}: each one's optimistic forecast of {data.objective} fell short of the best "
        "completed configuration; nothing to change unless the forecast level should be higher "
        "(hydra.sweeper.forecast_level).",
    )


def ended_below_baseline(data: StudyData) -> Advice | None:
    """Runs no rule pruned that still ended worse than they started."""
    worse = [t for t in data.by_state("complete") if below_baseline(t, data.maximize)]
    if not worse:
        return None
    shown = ", ".join(f"t{t.number} ({t.baseline:.3g} -> {t.value:.3g})" for t in worse[:6])
    return Advice(
        "Check the trials that ended below their baseline",
        f"{len(worse)} completed trial(s) ended with a held-out reward below their step-0 "
        f"baseline although no health rule pruned them: {shown}. Training made them worse; "
        "their settings are on the unstable side.",
    )


def below_baseline(t: TrialRecord, maximize: bool = True) -> bool:
    """A completed trial whose objective ended below its baseline by more than its noise."""
    if not (maximize and is_finite_number(t.value) and is_finite_number(t.baseline)):
        return False
    noise = 2 * t.stderr if is_finite_number(t.stderr) else 0.0
    return t.value < t.baseline - noise


def scarce_signal(data: StudyData) -> Advice | None:
    fracs = [_mean_metric(t, GROUPS_MIXED) for t in data.trials]
    fracs = [f for f in fracs if f is not None]
    if not fracs or mean(fracs) >= LOW_FRAC_MIXED:
        return None
    good = _study_mean(data, GROUPS_ALL_GOOD)
    bad = _study_mean(data, GROUPS_ALL_BAD)
    if good is not None and bad is not None and good != bad:
        side = "all correct (too easy)" if good > bad else "all wrong (too hard)"
        detail = f" Most constant groups are {side}."
    else:
        detail = ""
    return Advice(
        f"{MORE_SIGNAL[0].upper()}{MORE_SIGNAL[1:]}",
        f"On average only {mean(fracs):.0%} of groups had mixed rewards ({GROUPS_MIXED}); "
        f"a group whose rollouts all score the same gives zero advantage.{detail}",
    )


def baseline_fit(data: StudyData) -> Advice | None:
    baselines = [t.baseline for t in data.trials if is_finite_number(t.baseline)]
    if not baselines:
        return None
    b = median(baselines)
    if b <= BASELINE_TOO_HARD:
        return Advice(
            "Make the task easier or use a stronger model",
            f"The baseline eval reward (step 0, before any update) is {b:.1%}: with almost no "
            "correct rollouts there is nothing to reinforce.",
        )
    if b >= BASELINE_TOO_EASY:
        return Advice(
            "Make the task harder or use a weaker starting model",
            f"The baseline eval reward is already {b:.1%}: little room to improve, and most "
            "groups score all-correct (no signal).",
        )
    return None


def edge_of_range(data: StudyData) -> list[Advice]:
    """The best trial's value sits at a bound of its range: the optimum may lie beyond. Not
    when the verdict calls the best tied with every other configuration: then no edge is
    the best's, and seeds come before moving the range, or the cause the verdict names that
    seeds cannot fix (analysis/next_step.py)."""
    best = data.best()
    if best is None or len(data.by_state("complete")) < 2:
        return []
    judged = study_verdict(data.study, data.attrs, data.maximize)
    others = [s.label for s in judged.ranked[1:]]
    if others and set(others) <= set(judged.tied_with_best):
        if (cause := judged.cause) is not None:
            return [
                Advice(
                    f"{cause.do[0].upper()}{cause.do[1:]} before moving the range",
                    f"The best trial {judged.best.label} is tied with every other configuration "
                    f"({', '.join(others)}), and more seeds will not tell: {cause.said}.",
                )
            ]
        return [
            Advice(
                "Run more seeds before moving the range (hydra.sweeper.seeds)",
                f"The best trial {judged.best.label} is tied with every other configuration "
                f"at this sample size ({', '.join(others)}): which end of the range is better "
                "is not known yet.",
            )
        ]
    out = []
    for name, value in best.params.items():
        side = _edge(data.distributions.get(name), value)
        if side is None:
            continue
        spec = (data.attrs.get(StudyAttr.SEARCH_SPACE) or {}).get(name, "")
        out.append(
            Advice(
                f"Extend the range of {name} {'upward' if side == 'high' else 'downward'}",
                f"The best trial t{best.number} has {name}={value}, at the {side} end of the "
                f"range searched{f' ({spec})' if spec else ''}.",
            )
        )
    return out


def _edge(dist, value) -> str | None:
    if isinstance(dist, CategoricalDistribution):
        numeric = [
            c for c in dist.choices if isinstance(c, int | float) and not isinstance(c, bool)
        ]
        if len(numeric) < 2 or len(numeric) != len(dist.choices):
            return None
        return "high" if value == max(numeric) else "low" if value == min(numeric) else None
    if isinstance(dist, FloatDistribution | IntDistribution) and dist.high > dist.low:
        scale = math.log if dist.log else float
        low, high, x = scale(dist.low), scale(dist.high), scale(value)
        share = (x - low) / (high - low)
        return "high" if share >= 1 - EDGE_SHARE else "low" if share <= EDGE_SHARE else None
    return None


def still_rising(data: StudyData) -> Advice | None:
    best = data.best()
    evals = (best.histories.get(data.objective) if best else None) or []
    if len(evals) < 3:
        return None
    (_, a), (_, b), (step, c) = evals[-3:]
    rising = c > b > a if data.direction == "maximize" else c < b < a
    if not rising:
        return None
    return Advice(
        "Train longer (raise max_steps)",
        f"The best trial t{best.number}'s {data.objective} was still improving at its last "
        f"eval (step {step}: {a:.3g} -> {b:.3g} -> {c:.3g}).",
    )


def no_gain(data: StudyData) -> Advice | None:
    best = data.best()
    if best is None or not is_finite_number(best.baseline) or data.direction != "maximize":
        return None
    if best.value > best.baseline:
        return None
    return Advice(
        "Raise the learning rate or train longer",
        f"The best trial t{best.number} ends at {best.value:.3g}, no better than its baseline "
        f"{best.baseline:.3g}: training has not helped yet.",
    )


def failures(data: StudyData) -> Advice | None:
    failed = data.by_state("failed")
    if not failed:
        return None
    reasons: dict[str, int] = {}
    for t in failed:
        reasons[t.note] = reasons.get(t.note, 0) + 1
    common, count = max(reasons.items(), key=lambda kv: kv[1])
    return Advice(
        "Fix what makes trials fail",
        f"{len(failed)} of {len(data.trials)} trials failed; most often ({count}x): {common}",
    )


RULES: list[Rule] = [
    failures,
    health_pruning,
    forecast_stops,
    ended_below_baseline,
    baseline_fit,
    scarce_signal,
    edge_of_range,
    still_rising,
    no_gain,
]


def advise(data: StudyData) -> list[Advice]:
    """Every rule that fires, in the order above (most urgent first)."""
    out: list[Advice] = []
    for rule in RULES:
        result = rule(data)
        if isinstance(result, Advice):
            out.append(result)
        elif result:
            out.extend(result)
    return out


def _mean_metric(t: TrialRecord, metric: str) -> float | None:
    values = [v for _, v in t.histories.get(metric, []) if math.isfinite(v)]
    return mean(values) if values else None


def _study_mean(data: StudyData, metric: str) -> float | None:
    values = [m for m in (_mean_metric(t, metric) for t in data.trials) if m is not None]
    return mean(values) if values else None
