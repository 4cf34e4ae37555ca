"""Text a person reads: one-line errors and aligned tables, shared by the sweeper and analysis."""

from __future__ import annotations

from collections.abc import Sequence

from trainer.validation import first_line

__all__ = ["fail_reason", "first_line", "text_table"]


def fail_reason(error: BaseException) -> str:
    """A failed trial's `fail_reason`: the exception type and its first line."""
    return (
        f"{type(error).__name__}: {first_line(error)}"
        if str(error).strip()
        else type(error).__name__
    )


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
