"""The verdict's last line, what to run next (analysis/verdict.py says the rest), and what
comes before any ranking: nothing learned, or too few seeds to tell (learned_nothing).

A tie, too few seeds to tell, or nothing learned would ask for more seeds (or a larger lr).
First it names a cause seeds cannot fix, when the study recorded one for every configuration
the line is about (the tied ones, or all). In this order:

  - truncation: every completion of the baseline eval hit max_tokens (TrialAttr.
    BASELINE_TRUNCATED, from each configuration's first baseline eval; records.metrics.all_cut);
  - no learning signal: most groups scored alike, all correct or all wrong (every completed
    seed carries the no_learning_signal health warning, trainer/run/health/rules.py);
  - an eval too small: its problems (the seeds' per-problem rewards) cannot tell apart the
    difference that counts (hydra.sweeper.min_difference, else 0.2), in the numbers the sweep
    said before its first trial (judge.stats.problems_short).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from optuna.trial import FrozenTrial, TrialState

from analysis.text import interval_text
from judge import stats
from judge.configs import Config
from records.metrics import all_cut, is_finite_number
from records.sweep import State, StudyAttr, TrialAttr, replicates
from trainer.run.health.rules import NO_LEARNING_SIGNAL


class Summary(Protocol):
    """A configuration as the verdict summarized it (analysis/verdict.py's Summary)."""

    config: Config
    interval: stats.Interval

    @property
    def label(self) -> str: ...

    @property
    def mean(self) -> float: ...


# What a study without a learning signal needs (analysis/advice.py says it too).
MORE_SIGNAL = "raise group_size, or change the task's difficulty"
NO_HELP = "seeds will not help"

BROKE = (
    "Next: the table's notes say what broke each one; fix that (a lower lr, a looser health "
    "rule: docs/health.md), then run again."
)
TOO_FEW_SEEDS = (
    "Next: more seeds (hydra.sweeper.max_seeds when raced, else seeds) or longer runs "
    "(max_steps) would tell."
)


@dataclass(frozen=True)
class Evidence:
    """What the trials recorded that seeds cannot fix, by configuration label ("t2")."""

    truncated: Mapping[str, float] = field(default_factory=dict)  # baseline share cut
    no_signal: frozenset[str] = frozenset()  # every completed seed warned no_learning_signal
    share_held_out: frozenset[str] = frozenset()  # task=jsonl: its eval is a share of the rows
    min_difference: float | None = None  # the study's; None: judge.stats.LOOKED_FOR


@dataclass(frozen=True)
class Cause:
    """Why more seeds would not tell, as the study recorded it."""

    do: str  # what to run instead: "raise max_tokens"
    said: str  # the evidence, a clause: "every baseline completion hit max_tokens"

    @property
    def next_step(self) -> str:
        return f"Next: {self.do} ({self.said}); {NO_HELP}."


def evidence_of(trials: Iterable[FrozenTrial], study_attrs: Mapping[str, Any]) -> Evidence:
    """The causes each completed trial recorded (labelled as judge.configs labels them)."""
    done = {f"t{t.number}": t for t in trials if t.state == TrialState.COMPLETE}
    cut = TrialAttr.BASELINE_TRUNCATED
    return Evidence(
        {label: t.user_attrs[cut] for label, t in done.items() if cut in t.user_attrs},
        frozenset(label for label, t in done.items() if _no_signal(t)),
        frozenset(label for label, t in done.items() if _share_held_out(t)),
        study_attrs.get(StudyAttr.MIN_DIFFERENCE),
    )


def _share_held_out(trial: FrozenTrial) -> bool:
    return "task=jsonl" in (trial.user_attrs.get(TrialAttr.OVERRIDES) or [])


def _no_signal(trial: FrozenTrial) -> bool:
    seeds = [r for r in replicates(trial) if r.state == State.COMPLETE]
    said = [{line.split(":")[0] for line in r.warnings} for r in seeds]
    return bool(seeds) and all(NO_LEARNING_SIGNAL in rules for rules in said)


def cause_of(configs: Sequence[Config], evidence: Evidence | None) -> Cause | None:
    """The first cause that holds for every one of `configs`, else None (see module)."""
    if evidence is None or not configs:
        return None
    labels = [c.label for c in configs]
    shares = [evidence.truncated[label] for label in labels if label in evidence.truncated]
    if shares and all(all_cut(s) for s in shares):  # a resumed trial may not have said
        return Cause("raise max_tokens", "every baseline completion hit max_tokens")
    if all(label in evidence.no_signal for label in labels):
        return Cause(MORE_SIGNAL, "groups scored alike: no learning signal")
    counts = [len(s.per_problem) for c in configs for s in c.completed if s.per_problem]
    problems = max(counts, default=0)
    need = stats.problems_short(problems, evidence.min_difference) if problems else None
    if need is None:
        return None
    looked_for = evidence.min_difference or stats.LOOKED_FOR
    smallest = stats.detectable_difference(stats.WIDEST_SD, problems)
    do = f"task.eval_size={need}"
    if any(label in evidence.share_held_out for label in labels):
        do = f"task.eval_fraction for {need}+ problems"
    gaps = f"{problems} eval problems tell apart only gaps of {smallest:.2f}+, not {looked_for:g}"
    return Cause(do, gaps)


def reuse(label: str, study: str | None) -> str:
    where = f"tuned/{study}.yaml" if study else "the tuned file"
    return f"Next: train with {label}'s settings ({where}), or search around them."


def more_needed(
    a: Config,
    b: Config,
    level: float,
    max_seeds: int | None,
    pool: stats.Pooled | None = None,
    cause: Cause | None = None,
) -> tuple[str, str]:
    """What would separate two tied configurations (a clause of the decision), and the line
    that says what to run: the cause seeds cannot fix, when one holds."""
    if cause is not None:
        return cause.said, cause.next_step
    if max_seeds is None or min(len(a.values), len(b.values)) < 2:
        return (
            "more seeds would tell",
            "Next: more seeds (hydra.sweeper.seeds=auto races them) or a larger eval "
            "(task.eval_size).",
        )
    need = stats.seeds_to_separate(a.values, b.values, level, pool)
    if not math.isfinite(need):
        return (
            "their means are equal",
            "Next: take either; a larger eval (task.eval_size) or more max_steps may tell "
            "them apart.",
        )
    return (
        f"~{need} seeds each would separate {b.label} from it",
        # a grid's budget must let the seeds run too (racing.Budget)
        f"Next: hydra.sweeper.max_seeds={need} hydra.sweeper.budget_seeds={need}, or a larger "
        "eval (task.eval_size).",
    )


def likely_cause(ranked_params: Sequence[Mapping[str, Any]], short: bool = False) -> str:
    """Why nothing moved when no recorded cause says: updates too small for this model."""
    lrs = [p["lr"] for p in ranked_params if isinstance(p.get("lr"), float)]
    where = f" (the largest tried here is {max(lrs):g})" if lrs else ""
    if short:
        return (
            f"Next: a larger lr{where} (lr=auto gives the recommendation for this model) or "
            f"more max_steps; {NO_HELP} until something moves."
        )
    return (
        f"Likely cause: the updates are too small to change this model: lr{where} may be far "
        "below what it needs (lr=auto gives the recommendation for its size), or max_steps too "
        "few. Seeds will not help until something moves."
    )


def learned_nothing(
    ranked: Sequence[Summary], maximize: bool, cause: Cause | None = None
) -> tuple[str, str, str, Cause | None] | None:
    """First of all, whether anything moved off its baseline: (decision, next step, why, the
    cause recorded) or None. "Learned nothing" only when no configuration's interval reaches
    a gain over its baseline larger than the eval's standard error (the baseline's noise);
    when none excludes its baseline but some interval reaches such a gain, the seeds are too
    few to tell, and nothing is diagnosed, unless the study recorded a cause (see module)."""
    with_baseline = [s for s in ranked if is_finite_number(s.config.baseline) and s.interval.known]
    if not with_baseline or len(with_baseline) < len(ranked):
        return None
    if not all(_holds(s) for s in with_baseline):
        return None  # some configuration moved off its baseline beyond its interval
    sign = 1 if maximize else -1
    top = max(with_baseline, key=lambda s: sign * (s.mean - s.config.baseline))
    gain = top.mean - top.config.baseline
    reach = {s.label: _reach(s, sign) for s in with_baseline}
    wide = [s for s in with_baseline if reach[s.label] > (s.config.eval_stderr or 0.0)]
    if wide:
        w = max(wide, key=lambda s: reach[s.label])
        tell = "more seeds (hydra.sweeper.seeds) would tell" if cause is None else cause.said
        return (
            f"Too few seeds to tell if training moved anything: {w.label}'s 95% CI "
            f"({w.interval.low:.3g} to {w.interval.high:.3g}) holds its baseline "
            f"{w.config.baseline:.3g}.",
            TOO_FEW_SEEDS if cause is None else cause.next_step,
            f"Too few seeds to tell whether training moved anything: no configuration's interval "
            f"excludes its baseline, yet {w.label}'s reaches {reach[w.label]:.3g} above it "
            f"({interval_text(w.interval)}); {tell}.",
            cause,
        )
    i = top.interval
    base = top.config.baseline
    params = [s.config.params for s in ranked]
    likely = likely_cause(params) if cause is None else f"Likely cause: {cause.said}."
    return (
        f"Nothing learned: no configuration moved off its baseline; the largest change is "
        f"{gain:+.3g} ({top.label}, 95% CI {i.low - base:+.3g} to {i.high - base:+.3g}).",
        likely_cause(params, short=True) if cause is None else cause.next_step,
        f"No configuration moved off its baseline by more than the noise: the largest change is "
        f"{gain:+.3g} ({top.label}, from {base:.4g}), and no interval reaches a "
        f"gain larger than the eval's standard error. {likely}",
        cause,
    )


def _holds(s: Summary) -> bool:
    """The configuration's interval holds its baseline."""
    return s.interval.low <= s.config.baseline <= s.interval.high


def _reach(s: Summary, sign: int) -> float:
    """The largest gain over its baseline the configuration's interval allows."""
    edge = s.interval.high if sign == 1 else s.interval.low
    return sign * (edge - s.config.baseline)
