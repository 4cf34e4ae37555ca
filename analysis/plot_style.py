"""What the report's figures share: colours, markers, legend entries, and the layout that
keeps every text on the canvas (matplotlib's constrained layout; titles and legend labels
wrapped to the width they have; legends beside the data, never over it)."""

from __future__ import annotations

import textwrap

import matplotlib

matplotlib.use("Agg")  # no display needed

from matplotlib.patches import Patch  # noqa: E402

from analysis.load import TrialRecord  # noqa: E402
from analysis.text import settings  # noqa: E402
from records.sweep import FORECAST_MEAN  # noqa: E402

LAYOUT = "constrained"  # every figure's: makes room for titles, labels and outside legends
CHAR_WIDTH_EM = 0.62  # a text character's mean width in DejaVu Sans, as a share of its size
LEGEND_CHARS = 34  # a legend label's line, wrapped past this
LABELLED_TRIALS = 10  # past this many, only the best trial gets a legend entry
BEST_COLOR = "tab:red"
# Every other trial's colour, by its number: the same in every figure, never the best's red.
TRIAL_COLORS = [f"tab:{c}" for c in ("blue", "orange", "green", "purple", "brown", "pink")]
TRIAL_COLORS += [f"tab:{c}" for c in ("gray", "olive", "cyan")]
SEEDS_ALPHA, STDERR_ALPHA = 0.12, 0.3
STDERR_GID = "eval-stderr-band"  # the stderr bands' matplotlib gid: found again by tests
FORECAST_GID = "forecast-line"  # pruner=forecast: the predicted final value's line
EVAL_CI_LABEL = "95% CI over eval problems (±1.96 stderr)"
STATE_MARKERS = {"complete": "o", "pruned": "X", "failed": "s", "running": "^", "waiting": "."}


NAME_CHARS = 60  # settings longer than this (long keys, many swept) leave no room for the data


def name(t: TrialRecord, sep: str = ", ") -> str:
    """A trial as its settings (`lr=0.001, group_size=8`); its id when nothing was swept or
    its settings would not fit beside the data (the report's table names them)."""
    shown = settings(t.params, sep)
    return shown if shown and len(shown) <= NAME_CHARS else f"t{t.number}"


def label(t: TrialRecord, best: TrialRecord | None, many: bool) -> str | None:
    """A curve's legend entry: its settings, the best's marked, a state other than complete."""
    if best is not None and t.number == best.number:
        return f"best: {name(t)}"
    if many:
        return None
    return name(t) if t.state == "complete" else f"{name(t)} ({t.state})"


def style(t: TrialRecord, best: TrialRecord | None) -> dict:
    if best is not None and t.number == best.number:
        return {"color": BEST_COLOR, "linewidth": 2.5, "alpha": 1.0, "zorder": 3}
    return {"color": TRIAL_COLORS[t.number % len(TRIAL_COLORS)], "linewidth": 1.0, "alpha": 0.6}


def wrap(text: str, inches: float, fontsize: float = 10.0) -> str:
    """`text` in lines that fit `inches` at `fontsize` points (its own line breaks kept)."""
    chars = max(12, int(inches * 72 / (fontsize * CHAR_WIDTH_EM)))
    return "\n".join(textwrap.fill(line, chars) for line in text.splitlines())


def suptitle(fig, text: str, fontsize: float = 12.0) -> None:
    fig.suptitle(wrap(text, fig.get_figwidth() * 0.95, fontsize), fontsize=fontsize)


def legend(ax, keys: list[Patch] = ()) -> None:
    """The axes' legend to the right of its data, labels wrapped."""
    handles, labels = ax.get_legend_handles_labels()
    handles, labels = handles + list(keys), labels + [k.get_label() for k in keys]
    if handles:
        ax.legend(
            handles=handles,
            labels=[textwrap.fill(label, LEGEND_CHARS) for label in labels],
            fontsize=8,
            loc="upper left",
            bbox_to_anchor=(1.02, 1.0),
            borderaxespad=0.0,
        )


def band_keys(trials: list[TrialRecord]) -> list[Patch]:
    """Legend entries that say what the eval panel's bands are."""
    keys = [Patch(color="grey", alpha=STDERR_ALPHA, label=EVAL_CI_LABEL)]
    if any(len(t.seed_histories) > 1 for t in trials):
        keys.append(Patch(color="grey", alpha=SEEDS_ALPHA, label="seeds' range (min to max)"))
    if any(t.histories.get(FORECAST_MEAN) for t in trials):
        label = "forecast of the final value at each eval (dotted) up to its optimistic bound"
        keys.append(Patch(facecolor="white", edgecolor="grey", hatch="//", label=label))
    return keys
