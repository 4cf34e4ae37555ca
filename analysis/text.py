"""Text a person reads, for the sweeper's lines and the analysis report alike: swept values,
table cells and aligned tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainer.base.metrics import is_finite_number


def show_value(value: Any) -> str:
    """A swept value as typed on the command line, strings as they are (`cuda:1`, not Hydra's
    escaped `cuda\\:1`). For every other value an Optuna parameter holds (None, bool, int,
    float) this is what Hydra's override grammar writes too."""
    return "null" if value is None else str(value)


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
