"""The KL figures, with the study's health rules drawn as the sweep pruned with them.

A figure's threshold line, its label and its title come from the rules the sweep stored
(StudyAttr.HEALTH_RULES, read back through trainer.run.health.rules_from_settings as the job
reads them), never from kl_threshold alone: the post-update KL rule's bound is a multiple of it
and fires only while the held-out reward is not above its baseline. A pruning rule is a dashed black line (as its prune points), a
warning rule a dotted orange one; a rule turned off (`hydra.sweeper.health=[]`) draws nothing.
Only threshold checks (above, below) have a line: the relative ones (below_baseline, ratio_*)
have a bound per trial, not one for the figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from analysis import plot_style as ps
from analysis.load import StudyData
from records.metrics import KL_MEANING, readable, titled
from records.sweep import StudyAttr
from trainer.base.config import TrainConfig
from trainer.run.health import Action, Check, Guard, HealthRule, guard_words, rules_from_settings

THRESHOLD_CHECKS = (Check.above, Check.below)
RULE_STYLE = {
    Action.prune: {"color": "black", "linestyle": "--", "linewidth": 1.4},
    Action.warn: {"color": "tab:orange", "linestyle": ":", "linewidth": 1.6},
}


def study_rules(attrs: dict[str, Any]) -> list[HealthRule] | None:
    """The rules the sweep checked, as it stored them; None when the study recorded none
    (or a form this version cannot read)."""
    stored = attrs.get(StudyAttr.HEALTH_RULES)
    if stored is None:
        return None
    threshold = attrs.get(StudyAttr.KL_THRESHOLD) or TrainConfig.kl_threshold
    try:
        return rules_from_settings(stored, threshold)
    except (TypeError, ValueError):
        return None


def threshold_rules(rules: Sequence[HealthRule] | None, metric: str) -> list[HealthRule]:
    """The rules with a fixed bound on this metric: those a figure draws as a line."""
    return [r for r in rules or [] if r.metric == metric and r.check in THRESHOLD_CHECKS]


def kl_metrics_watched(rules: Sequence[HealthRule] | None) -> list[str]:
    """The KL metrics a threshold rule watches, in the rules' order."""
    return list(
        dict.fromkeys(
            r.metric for r in rules or [] if r.metric in KL_MEANING and r.check in THRESHOLD_CHECKS
        )
    )


def rule_label(rule: HealthRule) -> str:
    """What the rule does, in the words of its record: `post_update_kl prunes above 0.2 for
    3 steps in a row, while eval/reward/mean falls`."""
    verb = "prunes" if rule.action == Action.prune else "warns"
    side = "above" if rule.check == Check.above else "below"
    steps = "1 step" if rule.patience == 1 else f"{rule.patience} steps in a row"
    text = f"{rule.name} {verb} {side} {rule.bound:g} for {steps}"
    if rule.warmup_steps:
        text += f" after step {rule.warmup_steps}"
    return text + "," + guard_words(rule) if rule.guard != Guard.none else text


def draw_rules(ax, rules: Sequence[HealthRule], vertical: bool = False) -> list[float]:
    """Each rule's bound as a line labelled with rule_label; returns the bounds drawn."""
    line = ax.axvline if vertical else ax.axhline
    for rule in rules:
        line(rule.bound, label=rule_label(rule), **RULE_STYLE[rule.action])
    return [r.bound for r in rules]


def fit_rules_to_curves(ax, rules: Sequence[HealthRule], curves: Sequence[float]) -> None:
    """A log panel's y axis spanning its curves and the bounds near them; a far bound (see
    FAR_FACTOR) is said in its legend entry, and stays off the axis."""
    sides = [far_side(r.bound, curves) for r in rules]
    if not any(sides):
        return
    near = [r.bound for r, side in zip(rules, sides, strict=True) if side is None]
    ax.set_ylim(min([*curves, *near]) / 2, max([*curves, *near]) * 2)
    labels = {rule_label(r): side for r, side in zip(rules, sides, strict=True) if side}
    for line in ax.get_lines():
        if (side := labels.get(line.get_label())) is not None:
            line.set_label(f"{line.get_label()} ({side} this panel)")


def metric_title(metric: str, rules: Sequence[HealthRule], recorded: bool) -> str:
    """`post_update_kl: kl_pre_post_v2` over the metric's meaning; says when no rule
    watches it, or when the study recorded no rules."""
    if rules:
        head = f"{', '.join(dict.fromkeys(r.name for r in rules))}: {metric}"
    elif recorded:
        head = f"{metric} (no health rule watches it)"
    else:
        head = f"{metric} (the study recorded no health rules)"
    meaning = KL_MEANING.get(metric)
    return f"{head}\n{meaning}" if meaning else head


def kl_curves(data: StudyData) -> Figure | str:
    """One panel per KL a health rule watches (the study's stored rules): every trial's curve,
    each rule's bound as a line labelled with what it does, and where trials were pruned."""
    rules = study_rules(data.attrs)
    kls = kl_metrics_watched(rules) or [data.kl_metric]
    if not any(t.histories.get(m) for t in data.trials for m in kls):
        return f"No {' or '.join(kls)} histories in MLflow for any trial."
    fig, axes = plt.subplots(
        1, len(kls), figsize=(7.5 * len(kls), 5.5), squeeze=False, layout=ps.LAYOUT
    )
    for ax, metric in zip(axes.flat, kls, strict=True):
        _kl_panel(ax, data, metric, rules)
    ps.suptitle(fig, f"KL the health rules watch — study {data.name}")
    return fig


def _kl_panel(ax, data: StudyData, metric: str, rules) -> None:
    with_curves = [t for t in data.trials if t.histories.get(metric)]
    best, many = data.best(), len(with_curves) > ps.LABELLED_TRIALS
    values_all = [v for t in with_curves for _, v in t.histories[metric]]
    for t in with_curves:
        steps, values = zip(*t.histories[metric], strict=True)
        ax.plot(steps, values, label=ps.label(t, best, many), **ps.style(t, best))
    pruned = [r for t in data.trials if (r := t.prune_reason) and r.get("metric") == metric]
    if pruned:
        ax.scatter(
            [r["step"] for r in pruned],
            [r["value"] for r in pruned],
            marker="X",
            s=80,
            color="black",
            zorder=4,
            label="pruned here",
        )
    drawn = threshold_rules(rules, metric)
    curves = [v for v in values_all if math.isfinite(v)]
    bounds = draw_rules(ax, drawn)
    if curves and all(v > 0 for v in curves + bounds):
        ax.set_yscale("log")
        fit_rules_to_curves(ax, drawn, curves)
    ax.set_title(ps.wrap(metric_title(metric, drawn, rules is not None), 4.2, 10), fontsize=10)
    ax.set(xlabel="training step", ylabel=f"{readable(metric)} (nats per token)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3, which="both")
    ps.legend(ax)


# A bound this many times beyond every curve is not drawn into a log panel: the sampler-vs-learner
# KL with one update a batch sits near 1e-13 beside its 0.01 bound, and the panel was empty
# decades between them. Its legend entry says where it is instead.
FAR_FACTOR = 100.0


def far_side(bound: float, curves: Sequence[float]) -> str | None:
    """ "above" or "below" when `bound` lies FAR_FACTOR beyond every curve value, else None."""
    if bound > max(curves) * FAR_FACTOR:
        return "above"
    return "below" if bound < min(curves) / FAR_FACTOR else None


def pareto_front(points: list[tuple[float, float, int]], maximize: bool) -> list[int]:
    """Trials no other beats on both reward (higher, or lower when minimizing) and KL (lower).

    points: (kl, reward, trial number). Returns the front's trial numbers by KL.
    """
    sign = 1 if maximize else -1
    front = []
    for kl, reward, number in points:
        dominated = any(
            k <= kl and sign * r >= sign * reward and (k < kl or sign * r > sign * reward)
            for k, r, _ in points
        )
        if not dominated:
            front.append((kl, number))
    return [n for _, n in sorted(front)]


def _draw_front(front: list[tuple[float, float, int]], ax) -> None:
    """The Pareto front as a red line through circled points."""
    front = sorted(front)
    ax.plot(
        [kl for kl, _, _ in front],
        [r for _, r, _ in front],
        color=ps.BEST_COLOR,
        marker="o",
        markersize=9,
        markerfacecolor="none",
        linewidth=1.5,
        label="Pareto front (high reward, low KL)",
    )


def reward_vs_kl(data: StudyData) -> Figure | str:
    """Each trial's final KL against its reward; the Pareto front of high reward, low KL."""
    sel = [
        t
        for t in data.trials
        if t.final_kl is not None and (t.value if t.value is not None else t.last_eval) is not None
    ]
    if not sel:
        return "No trial has both a final KL and a reward yet."
    reward = {t.number: t.value if t.value is not None else t.last_eval for t in sel}
    # Failed trials are shown but never on the front: their numbers are not a result.
    points = [(t.final_kl, reward[t.number], t.number) for t in sel if t.state != "failed"]
    front = pareto_front(points, data.direction == "maximize")
    fig, ax = plt.subplots(figsize=(9, 5.2), layout=ps.LAYOUT)
    for state, marker in ps.STATE_MARKERS.items():
        group = [t for t in sel if t.state == state]
        if group:
            ax.scatter(
                [t.final_kl for t in group],
                [reward[t.number] for t in group],
                marker=marker,
                alpha=0.7,
                label=state,
            )
    _draw_front([(by_kl, reward[n], n) for by_kl, _, n in points if n in front], ax)
    for t in sel:  # every point named, on the front or not
        ax.annotate(
            ps.name(t),
            (t.final_kl, reward[t.number]),
            textcoords="offset points",
            xytext=(5, 5),
            fontsize=8,
        )
    bounds = draw_rules(ax, threshold_rules(study_rules(data.attrs), data.kl_metric), True)
    if all(v > 0 for v in [t.final_kl for t in sel] + bounds):
        ax.set_xscale("log")
    meaning = KL_MEANING.get(data.kl_metric, "")
    ax.set(
        title=ps.wrap(f"Reward vs KL across trials — study {data.name}", 6.0, 12),
        xlabel=ps.wrap(f"last {data.kl_metric} (nats per token)\n{meaning}", 6.0),
        ylabel=f"{titled(data.objective)} (pruned: last eval)",
    )
    ax.grid(alpha=0.3, which="both")
    ps.legend(ax)
    return fig
