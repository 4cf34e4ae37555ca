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

from analysis import plot_style as ps  # noqa: E402
from analysis.kl_plots import kl_curves, pareto_front, reward_vs_kl  # noqa: E402
from analysis.load import EVAL_REWARD, REWARD, StudyData, TrialRecord  # noqa: E402
from analysis.proportions import Z95  # noqa: E402
from analysis.verdict import study_verdict  # noqa: E402
from records.metrics import LR, readable, stderr_of, titled  # noqa: E402
from records.sweep import (  # noqa: E402
    FORECAST_HIGH,
    FORECAST_MEAN,
    StudyAttr,  # noqa: E402
)

__all__ = ["FIGURES", "draw_all", "pareto_front"]  # pareto_front: tested on its own

MIN_TRIALS_FOR_IMPORTANCE = 5  # fANOVA on fewer completed trials ranks noise

Plot = Callable[[StudyData], "Figure | str"]


def seed_band(
    t: TrialRecord, metric: str
) -> tuple[list[int], list[float], list[float], list[float]]:
    """Per step: the mean over the trial's seeds, and their min and max (one seed: itself)."""
    runs = _seed_runs(t, metric)
    steps = sorted(set().union(*runs))
    at = [[run[s] for run in runs if s in run] for s in steps]
    return steps, [sum(v) / len(v) for v in at], [min(v) for v in at], [max(v) for v in at]


def stderr_band(t: TrialRecord, metric: str) -> tuple[list[int], list[float], list[float]]:
    """Per step where every seed logged `metric` and its standard error (`stderr_of`): the
    mean over seeds and that mean's standard error (mean_stderr)."""
    means, errors = _seed_runs(t, metric), _seed_runs(t, stderr_of(metric))
    steps = sorted(set.intersection(*(set(m) & set(e) for m, e in zip(means, errors, strict=True))))
    mean = [sum(run[s] for run in means) / len(means) for s in steps]
    return steps, mean, [mean_stderr([run[s] for run in errors]) for s in steps]


def mean_stderr(stderrs: list[float]) -> float:
    """The standard error of the mean of independent means, from each one's standard error:
    sqrt(sum of their squares) / their count."""
    return math.sqrt(sum(e * e for e in stderrs)) / len(stderrs)


def _seed_runs(t: TrialRecord, metric: str) -> list[dict[int, float]]:
    return [dict(h.get(metric) or []) for h in t.seed_histories.values()] or [
        dict(t.histories.get(metric) or [])
    ]


def config_intervals(data: StudyData) -> Figure | str:
    """Each completed configuration's mean objective with its 95% CI, named by its settings,
    the best mean first (the verdict's ranking weighs more than the mean: the axis does not)."""
    ranked = study_verdict(data.study, data.attrs, data.maximize).ranked
    if len(ranked) < 2:
        return "Fewer than two completed configurations: nothing to compare."
    ranked = sorted(ranked, key=lambda s: s.interval.estimate, reverse=data.maximize)
    trials = {f"t{t.number}": t for t in data.trials}
    names = [ps.name(trials[s.label], "\n") if s.label in trials else s.label for s in ranked]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(ranked) + 3), 4.8), layout=ps.LAYOUT)
    for x, s in enumerate(ranked):
        i = s.interval
        err = [[i.estimate - i.low], [i.high - i.estimate]] if i.known else None
        color = ps.BEST_COLOR if x == 0 else "tab:blue"
        ax.errorbar([x], [i.estimate], yerr=err, fmt="o", color=color, capsize=5)
    ax.set_xticks(range(len(ranked)), names, fontsize=8)
    methods = list(dict.fromkeys(s.interval.method for s in ranked))  # in the axis's order
    title = f"{titled(data.objective)}: mean and 95% CI per configuration ({'; '.join(methods)})"
    ax.set_title(ps.wrap(title, fig.get_figwidth() * 0.8))
    ax.set(xlabel="configuration (best mean first)", ylabel=readable(data.objective))
    ax.grid(alpha=0.3, axis="y")
    return fig


def reward_curves(data: StudyData) -> Figure | str:
    """Training reward/mean and eval/reward/mean of every trial (the mean over its seeds, with
    their spread as a band; the eval's standard error over problems as a second band), the
    best one in red."""
    with_curves = [
        t for t in data.trials if t.histories.get(REWARD) or t.histories.get(EVAL_REWARD)
    ]
    if not with_curves:
        return "No reward histories in MLflow for any trial."
    best, many = data.best(), len(with_curves) > ps.LABELLED_TRIALS
    # Separate y scales: held-out reward moves in a narrower band than per-step training reward.
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), layout=ps.LAYOUT)
    for ax, metric, title in (
        (axes[0], REWARD, f"{titled(REWARD)}, mean over rollouts"),
        (axes[1], EVAL_REWARD, f"{titled(EVAL_REWARD)}, step 0 = baseline"),
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
                    label=ps.label(t, best, many),
                    **ps.style(t, best),
                )
                color = line[0].get_color()
                if len(t.seed_histories) > 1:  # the seeds' spread as a band around their mean
                    ax.fill_between(steps, low, high, color=color, alpha=ps.SEEDS_ALPHA, lw=0)
                if metric == EVAL_REWARD:  # the eval's noise over problems: its 95% CI
                    at, mean, err = stderr_band(t, metric)
                    ax.fill_between(
                        at,
                        [m - Z95 * e for m, e in zip(mean, err, strict=True)],
                        [m + Z95 * e for m, e in zip(mean, err, strict=True)],
                        color=color,
                        alpha=ps.STDERR_ALPHA,
                        lw=0,
                        gid=ps.STDERR_GID,
                    )
                    forecast_band(ax, t, color)
        ax.set(title=title, xlabel="training step", ylabel=f"{readable(metric)} (per rollout)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    ps.legend(axes[1], ps.band_keys(with_curves))  # forecasts too, when drawn
    ps.suptitle(fig, f"Reward curves — study {data.name}")
    return fig


def forecast_band(ax, t: TrialRecord, color: str) -> None:
    """pruner=forecast: at each eval step, the final value it predicted (dotted) and up to its
    optimistic bound (hatched), in the trial's colour."""
    means = dict(t.histories.get(FORECAST_MEAN) or [])
    highs = dict(t.histories.get(FORECAST_HIGH) or [])
    steps = sorted(set(means) & set(highs))
    if not steps:
        return
    mean, high = [means[s] for s in steps], [highs[s] for s in steps]
    ax.plot(steps, mean, ls=":", marker="x", markersize=4, color=color, gid=ps.FORECAST_GID)
    ax.fill_between(steps, mean, high, color=color, alpha=ps.SEEDS_ALPHA, hatch="//", lw=0)


def objective_vs_params(data: StudyData) -> Figure | str:
    """The objective against each swept hyperparameter, each completed configuration with the
    verdict's 95% CI (the verdict figure's); pruned trials at their last eval; lr and
    log-declared parameters on a log axis. One legend for every panel, beside them."""
    names = data.param_names
    points = [t for t in data.trials if t.value is not None or t.last_eval is not None]
    if not names or not points:
        return "No swept parameters with an objective value yet."
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(4.5 * cols + 2, 3.6 * rows + 0.6), squeeze=False, layout=ps.LAYOUT
    )
    log_params = log_scaled(data)
    best = data.best()
    ranked = study_verdict(data.study, data.attrs, data.maximize).ranked
    intervals = {s.label: s.interval for s in ranked if s.interval.known}
    for ax, name in zip(axes.flat, names, strict=False):
        _param_panel(ax, data, name, points, best, name in log_params, intervals)
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    handles = {}  # every panel's entries once, the first panel's order first
    for ax in axes.flat[: len(names)]:
        handles.update(zip(*reversed(ax.get_legend_handles_labels()), strict=True))
    fig.legend(list(handles.values()), list(handles), loc="outside right upper", fontsize=8)
    ps.suptitle(fig, f"{titled(data.objective)} against each hyperparameter — study {data.name}")
    return fig


def log_scaled(data: StudyData) -> set[str]:
    """The swept parameters drawn on a log axis: those the search space declared log, and lr
    (the learning rate, its setting named as its metric), which a grid lists in decades."""
    declared = set(data.attrs.get(StudyAttr.LOG_PARAMS) or [])
    declared |= {n for n, d in data.distributions.items() if getattr(d, "log", False)}
    return declared | {LR}


def _param_panel(ax, data: StudyData, name: str, points, best, log: bool, intervals) -> None:
    values = [t.params.get(name) for t in points]
    categorical = any(isinstance(v, str | bool) for v in values if v is not None)
    order = sorted({str(v) for v in values if v is not None}) if categorical else None
    for state, marker in ps.STATE_MARKERS.items():
        sel = [t for t in points if t.state == state and name in t.params]
        if not sel:
            continue
        xs = [order.index(str(t.params[name])) if categorical else t.params[name] for t in sel]
        ys = [t.value if t.value is not None else t.last_eval for t in sel]
        label = state if state == "complete" else f"{state} (last eval)"
        dots = ax.scatter(xs, ys, marker=marker, alpha=0.75, label=label)
        # The verdict's interval of each completed configuration (pruned and failed: none).
        cis = [intervals.get(f"t{t.number}") if t.value is not None else None for t in sel]
        if any(cis):
            below = [max(0.0, y - i.low) if i else 0.0 for y, i in zip(ys, cis, strict=True)]
            above = [max(0.0, i.high - y) if i else 0.0 for y, i in zip(ys, cis, strict=True)]
            ax.errorbar(
                xs,
                ys,
                yerr=[below, above],
                fmt="none",
                ecolor=dots.get_facecolor()[0],
                alpha=0.6,
                capsize=3,
                gid=ps.STDERR_GID,
                label="95% CI (as in the verdict)",
            )
    if best is not None and name in best.params:
        x = order.index(str(best.params[name])) if categorical else best.params[name]
        ax.scatter(
            [x],
            [best.value],
            s=160,
            facecolors="none",
            edgecolors=ps.BEST_COLOR,
            linewidths=2,
            label=f"best: {ps.name(best)}",
            zorder=4,
        )
    if categorical:
        ax.set_xticks(range(len(order)), order)
    log = log and not categorical and all(v > 0 for v in values if v is not None)
    if log:
        ax.set_xscale("log")
    width = ax.get_figure().get_figwidth() / 4  # a panel's, at most 3 across beside the legend
    ax.set_title(ps.wrap(name, width, 10))
    ax.set(
        xlabel=ps.wrap(name + (" (log scale)" if log else ""), width),
        ylabel=readable(data.objective),
    )
    ax.grid(alpha=0.3)


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
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(names) + 2), layout=ps.LAYOUT)
    ax.barh([ps.wrap(n, 2.5) for n in names], [scores[n] for n in names], color="tab:blue")
    ax.set(
        title=f"Hyperparameter importance (fANOVA, {len(done)} completed trials)",
        xlabel=f"share of the {titled(data.objective)} variance explained",
        xlim=(0, 1),
    )
    ax.grid(alpha=0.3, axis="x")
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
