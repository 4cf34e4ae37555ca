"""The report's figures (matplotlib, Agg backend: no display needed).

Each function draws one figure from a StudyData and returns a Figure, or a string saying
why it was skipped (too few trials, no MLflow data), so the report shows the reason in
the figure's place instead of a blank.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import optuna  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from analysis.load import EVAL_REWARD, REWARD, StudyData, TrialRecord  # noqa: E402
from analysis.records import StudyAttr
from analysis.verdict import study_verdict  # noqa: E402

MIN_TRIALS_FOR_IMPORTANCE = 5  # fANOVA on fewer completed trials ranks noise
LABELLED_TRIALS = 10  # past this many, only the best trial gets a legend entry
BEST_COLOR = "tab:red"
STATE_MARKERS = {"complete": "o", "pruned": "X", "failed": "s", "running": "^", "waiting": "."}

Plot = Callable[[StudyData], "Figure | str"]


def _label(t: TrialRecord, best: TrialRecord | None, many: bool) -> str | None:
    if best is not None and t.number == best.number:
        return f"best: t{t.number}"
    return None if many else f"t{t.number} ({t.state})"


def _style(t: TrialRecord, best: TrialRecord | None) -> dict:
    if best is not None and t.number == best.number:
        return {"color": BEST_COLOR, "linewidth": 2.5, "alpha": 1.0, "zorder": 3}
    return {"linewidth": 1.0, "alpha": 0.6}


def seed_band(
    t: TrialRecord, metric: str
) -> tuple[list[int], list[float], list[float], list[float]]:
    """Per step: the mean over the trial's seeds, and their min and max (one seed: itself)."""
    runs = [dict(h.get(metric) or []) for h in t.seed_histories.values()] or [
        dict(t.histories.get(metric) or [])
    ]
    steps = sorted(set().union(*runs))
    at = [[run[s] for run in runs if s in run] for s in steps]
    return steps, [sum(v) / len(v) for v in at], [min(v) for v in at], [max(v) for v in at]


def config_intervals(data: StudyData) -> Figure | str:
    """Each completed configuration's mean objective with its 95% CI, best first."""
    ranked = study_verdict(data.study, data.attrs, data.maximize).ranked
    if len(ranked) < 2:
        return "Fewer than two completed configurations: nothing to compare."
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(ranked) + 3), 4.5))
    for x, s in enumerate(ranked):
        i = s.interval
        err = [[i.estimate - i.low], [i.high - i.estimate]] if i.known else None
        color = BEST_COLOR if x == 0 else "tab:blue"
        ax.errorbar([x], [i.estimate], yerr=err, fmt="o", color=color, capsize=5)
    ax.set_xticks(range(len(ranked)), [s.label for s in ranked])
    methods = sorted({s.interval.method for s in ranked})
    ax.set(
        title=f"{data.objective}: mean and 95% CI per configuration ({'; '.join(methods)})",
        xlabel="configuration (best first)",
        ylabel=data.objective,
    )
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def reward_curves(data: StudyData) -> Figure | str:
    """Training reward/mean and eval/reward/mean of every trial (the mean over its seeds, with
    their spread as a band), the best one in red."""
    with_curves = [
        t for t in data.trials if t.histories.get(REWARD) or t.histories.get(EVAL_REWARD)
    ]
    if not with_curves:
        return "No reward histories in MLflow for any trial."
    best, many = data.best(), len(with_curves) > LABELLED_TRIALS
    # Separate y scales: held-out reward moves in a narrower band than per-step training reward.
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, metric, title in (
        (axes[0], REWARD, "Training reward (mean over rollouts)"),
        (axes[1], EVAL_REWARD, "Eval reward (step 0 = baseline)"),
    ):
        for t in with_curves:
            steps, mean, low, high = seed_band(t, metric)
            if steps:
                marker = "o" if metric == EVAL_REWARD else None
                line = ax.plot(
                    steps,
                    mean,
                    marker=marker,
                    markersize=3,
                    label=_label(t, best, many),
                    **_style(t, best),
                )
                if len(t.seed_histories) > 1:  # the seeds' spread as a band around their mean
                    ax.fill_between(steps, low, high, color=line[0].get_color(), alpha=0.15)
        ax.set(title=title, xlabel="training step", ylabel=f"{metric} (reward per rollout)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    _legend(axes[1])
    fig.suptitle(f"Reward curves — study {data.name}")
    fig.tight_layout()
    return fig


def kl_curves(data: StudyData) -> Figure | str:
    """The pruning KL metric per trial, the threshold line and where trials were pruned."""
    metric = data.kl_metric
    with_curves = [t for t in data.trials if t.histories.get(metric)]
    if not with_curves:
        return f"No {metric} histories in MLflow for any trial."
    best, many = data.best(), len(with_curves) > LABELLED_TRIALS
    fig, ax = plt.subplots(figsize=(9, 4.5))
    values_all = [v for t in with_curves for _, v in t.histories[metric]]
    for t in with_curves:
        steps, values = zip(*t.histories[metric], strict=True)
        ax.plot(steps, values, label=_label(t, best, many), **_style(t, best))
    pruned = [
        t.prune_reason
        for t in data.trials
        if t.prune_reason and t.prune_reason.get("metric") == metric
    ]
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
    if data.kl_threshold is not None:
        ax.axhline(
            data.kl_threshold,
            color="tab:red",
            linestyle="--",
            label=f"prune threshold {data.kl_threshold:g}",
        )
        values_all.append(data.kl_threshold)
    if all(v > 0 for v in values_all if math.isfinite(v)):
        ax.set_yscale("log")
    ax.set(
        title=f"Sampler-vs-learner KL ({metric}) — study {data.name}",
        xlabel="training step",
        ylabel=f"{metric} (nats per token)",
    )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3, which="both")
    _legend(ax)
    fig.tight_layout()
    return fig


def objective_vs_params(data: StudyData) -> Figure | str:
    """The objective against each swept hyperparameter; pruned trials at their last eval."""
    names = data.param_names
    points = [t for t in data.trials if t.value is not None or t.last_eval is not None]
    if not names or not points:
        return "No swept parameters with an objective value yet."
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.6 * rows), squeeze=False)
    log_params = set(data.attrs.get(StudyAttr.LOG_PARAMS) or [])
    best = data.best()
    for ax, name in zip(axes.flat, names, strict=False):
        _param_panel(ax, data, name, points, best, name in log_params)
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    fig.suptitle(f"{data.objective} against each hyperparameter — study {data.name}")
    fig.tight_layout()
    return fig


def _param_panel(ax, data: StudyData, name: str, points, best, log: bool) -> None:
    values = [t.params.get(name) for t in points]
    categorical = any(isinstance(v, str | bool) for v in values if v is not None)
    order = sorted({str(v) for v in values if v is not None}) if categorical else None
    for state, marker in STATE_MARKERS.items():
        sel = [t for t in points if t.state == state and name in t.params]
        if not sel:
            continue
        xs = [order.index(str(t.params[name])) if categorical else t.params[name] for t in sel]
        ys = [t.value if t.value is not None else t.last_eval for t in sel]
        label = state if state == "complete" else f"{state} (last eval)"
        ax.scatter(xs, ys, marker=marker, alpha=0.75, label=label)
    if best is not None and name in best.params:
        x = order.index(str(best.params[name])) if categorical else best.params[name]
        ax.scatter(
            [x],
            [best.value],
            s=160,
            facecolors="none",
            edgecolors=BEST_COLOR,
            linewidths=2,
            label=f"best t{best.number}",
            zorder=4,
        )
    if categorical:
        ax.set_xticks(range(len(order)), order)
    elif log:
        ax.set_xscale("log")
    ax.set(
        xlabel=name + (" (log scale)" if log and not categorical else ""),
        ylabel=data.objective,
        title=name,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def importance(data: StudyData) -> Figure | str:
    """fANOVA importance of each param for the objective, over completed trials."""
    done = data.by_state("complete")
    if len(done) < MIN_TRIALS_FOR_IMPORTANCE:
        return (
            f"Hyperparameter importance needs at least {MIN_TRIALS_FOR_IMPORTANCE} "
            f"completed trials; this study has {len(done)}."
        )
    if data.study is None:
        return "Hyperparameter importance needs the Optuna study."
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scores = optuna.importance.get_param_importances(data.study)
    except (RuntimeError, ValueError) as e:
        return f"Hyperparameter importance could not be computed: {e}"
    if not scores:
        return "Hyperparameter importance: no parameter varied across completed trials."
    names = list(scores)[::-1]
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(names) + 1.8))
    ax.barh(names, [scores[n] for n in names], color="tab:blue")
    ax.set(
        title=f"Hyperparameter importance (fANOVA, {len(done)} completed trials)",
        xlabel=f"share of {data.objective} variance explained",
        xlim=(0, 1),
    )
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig


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
    """The Pareto front as a red line through circled points, each labelled t<number>."""
    front = sorted(front)
    ax.plot(
        [kl for kl, _, _ in front],
        [r for _, r, _ in front],
        color=BEST_COLOR,
        marker="o",
        markersize=9,
        markerfacecolor="none",
        linewidth=1.5,
        label="Pareto front (high reward, low KL)",
    )
    for kl, r, n in front:
        ax.annotate(f"t{n}", (kl, r), textcoords="offset points", xytext=(5, 5), fontsize=8)


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
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for state, marker in STATE_MARKERS.items():
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
    if data.kl_threshold is not None:
        ax.axvline(
            data.kl_threshold,
            color="tab:red",
            linestyle="--",
            label=f"prune threshold {data.kl_threshold:g}",
        )
    if all(t.final_kl > 0 for t in sel):
        ax.set_xscale("log")
    ax.set(
        title=f"Reward vs KL across trials — study {data.name}",
        xlabel=f"final {data.kl_metric} (nats per token)",
        ylabel=f"{data.objective} (pruned: last eval)",
    )
    ax.grid(alpha=0.3, which="both")
    _legend(ax)
    fig.tight_layout()
    return fig


FIGURES: dict[str, tuple[str, Plot]] = {
    "verdict": ("Which configurations are better: means with 95% CIs", config_intervals),
    "reward_curves": ("Reward curves", reward_curves),
    "kl_curves": ("KL curves and prune points", kl_curves),
    "objective_vs_params": ("Objective against each hyperparameter", objective_vs_params),
    "importance": ("Hyperparameter importance", importance),
    "reward_vs_kl": ("Reward vs KL", reward_vs_kl),
}


def draw_all(data: StudyData, out_dir: Path) -> dict[str, Path | str]:
    """Every figure as `<out_dir>/<name>.png`, or the reason it was skipped."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Path | str] = {}
    for name, (_, draw) in FIGURES.items():
        fig = draw(data)
        if isinstance(fig, str):
            results[name] = fig
            continue
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        results[name] = path
    return results


def _legend(ax) -> None:
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(fontsize=8, loc="best")
