"""What the report's figures share: colours, markers, legend entries (matplotlib)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # no display needed

from matplotlib.patches import Patch  # noqa: E402

from analysis.load import TrialRecord  # noqa: E402
from records.sweep import FORECAST_MEAN  # noqa: E402

LABELLED_TRIALS = 10  # past this many, only the best trial gets a legend entry
BEST_COLOR = "tab:red"
# Every other trial's colour, by its number: the same in every figure, never the best's red.
TRIAL_COLORS = [f"tab:{c}" for c in ("blue", "orange", "green", "purple", "brown", "pink")]
TRIAL_COLORS += [f"tab:{c}" for c in ("gray", "olive", "cyan")]
SEEDS_ALPHA, STDERR_ALPHA = 0.12, 0.3
STDERR_GID = "eval-stderr-band"  # the stderr bands' matplotlib gid: found again by tests
FORECAST_GID = "forecast-line"  # pruner=forecast: the predicted final value's line
STATE_MARKERS = {"complete": "o", "pruned": "X", "failed": "s", "running": "^", "waiting": "."}


def label(t: TrialRecord, best: TrialRecord | None, many: bool) -> str | None:
    if best is not None and t.number == best.number:
        return f"best: t{t.number}"
    return None if many else f"t{t.number} ({t.state})"


def style(t: TrialRecord, best: TrialRecord | None) -> dict:
    if best is not None and t.number == best.number:
        return {"color": BEST_COLOR, "linewidth": 2.5, "alpha": 1.0, "zorder": 3}
    return {"color": TRIAL_COLORS[t.number % len(TRIAL_COLORS)], "linewidth": 1.0, "alpha": 0.6}


def legend(ax, keys: list[Patch] = ()) -> None:
    handles, _ = ax.get_legend_handles_labels()
    handles += keys
    if handles:
        ax.legend(handles=handles, fontsize=8, loc="best")


def band_keys(trials: list[TrialRecord]) -> list[Patch]:
    """Legend entries that say what the eval panel's bands are."""
    keys = [Patch(color="grey", alpha=STDERR_ALPHA, label="±1 stderr over eval problems")]
    if any(len(t.seed_histories) > 1 for t in trials):
        keys.append(Patch(color="grey", alpha=SEEDS_ALPHA, label="seeds' range (min to max)"))
    if any(t.histories.get(FORECAST_MEAN) for t in trials):
        label = "forecast of the final value at each eval (dotted) up to its optimistic bound"
        keys.append(Patch(facecolor="white", edgecolor="grey", hatch="//", label=label))
    return keys
