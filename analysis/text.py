"""Text a person reads, for the sweeper's lines and the analysis report alike: swept values,
table cells, aligned tables, and a trial's one-line note (why it was pruned, failed or queued
again, and its warnings)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from judge.configs import broke
from judge.stats import LEVEL, Interval
from records.metrics import is_finite_number
from records.sweep import TrialAttr, replicates


def show_value(value: Any) -> str:
    """A swept value as typed on the command line, strings as they are (`cuda:1`, not Hydra's
    escaped `cuda\\:1`). For every other value an Optuna parameter holds (None, bool, int,
    float) this is what Hydra's override grammar writes too."""
    return "null" if value is None else str(value)


def settings(params: Mapping[str, Any], sep: str = ", ") -> str:
    """`lr=0.002346, group_size=4`: a configuration as a person reads it, a float to 4
    significant digits (run names and tuned files keep every digit)."""
    return sep.join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={show_value(v)}"
        for k, v in params.items()
    )


def show(params: Mapping[str, Any]) -> str:
    """`lr=2e-05 model.device=cuda:1`, for run names and progress lines."""
    return " ".join(f"{k}={show_value(v)}" for k, v in params.items())


def show_cell(value: Any) -> str:
    """A report table's cell: `-` for nothing, a float to six significant digits."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def show_num(value: Any, digits: int) -> str:
    """A number to `digits` significant digits, `-` when there is none to show."""
    return f"{value:.{digits}g}" if is_finite_number(value) else "-"


def text_table(rows: Sequence[Sequence[str]]) -> str:
    """Columns aligned with two spaces; the last column (a free-text note) is not padded."""
    if not rows:
        return ""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [c.ljust(w) for c, w in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)


def breach_text(reason: Mapping[str, Any]) -> str:
    """A stored prune reason as the one line people read (trainer.run.health.Breach's text)."""
    from trainer.run.health import Breach

    try:
        return str(Breach.from_dict(reason))
    except (KeyError, TypeError, ValueError):  # a record written by an older version
        return ", ".join(f"{k}={v}" for k, v in reason.items())


def trial_note(trial: FrozenTrial) -> str:
    """The one-line why of a pruned, failed or re-queued trial, and the warnings its seeds
    recorded ('' when there is nothing to say)."""
    attrs = trial.user_attrs
    if trial.state == TrialState.FAIL:
        return str(attrs.get(TrialAttr.FAIL_REASON, "failed (no reason recorded)"))
    if trial.state == TrialState.WAITING and TrialAttr.RETRY_OF in attrs:
        return f"queued again (retry of t{attrs[TrialAttr.RETRY_OF]})"
    notes = [f"warning {line}" for line in trial_warnings(trial)]
    reason = attrs.get(TrialAttr.PRUNE_REASON)
    if trial.state == TrialState.PRUNED:
        why = (
            breach_text(reason) if isinstance(reason, Mapping) else "pruned by the objective pruner"
        )
        notes.insert(0, why)
    elif isinstance(reason, Mapping):  # completed, with seeds that broke (counted at the floor)
        seeds = replicates(trial)
        broken = sum(broke(r) for r in seeds)
        notes.insert(0, f"{broken} of {len(seeds)} seeds broke: {breach_text(reason)}")
    return "; ".join(notes)


def trial_warnings(trial: FrozenTrial) -> list[str]:
    """Each warning rule's first line over the trial's seeds (a rule once, from its first seed)."""
    lines: dict[str, str] = {}
    for replicate in replicates(trial):
        for line in replicate.warnings:
            lines.setdefault(line.split(":", 1)[0], line)
    return list(lines.values())


def interval_text(i: Interval, level: float = LEVEL) -> str:
    """`95% CI 0.3 to 0.5, t over 3 seeds`: an interval and how it was computed."""
    if not i.known:
        return f"no interval: {i.method}"
    return f"{level * 100:.4g}% CI {i.low:.3g} to {i.high:.3g}, {i.method}"
