"""`python -m analysis compare A B`: two studies' best configs and objectives side by side."""

from __future__ import annotations

from typing import Any

from analysis.load import StudyData
from analysis.report import STATE_ORDER
from analysis.text import show_cell, show_num, text_table
from records.sweep import StudyAttr


def compare_rows(a: StudyData, b: StudyData) -> list[tuple[str, str, str]]:
    """(what, study A, study B) rows: setup, trial counts, best value, best params."""

    def counts(d: StudyData) -> str:
        return ", ".join(f"{len(d.by_state(s))} {s}" for s in STATE_ORDER if d.by_state(s))

    def best_value(d: StudyData) -> str:
        best = d.best()
        return f"{show_num(best.value, 4)} (t{best.number})" if best else "no completed trial"

    rows = [
        ("study", a.name, b.name),
        ("objective", f"{a.direction} {a.objective}", f"{b.direction} {b.objective}"),
        ("trials", counts(a) or "none", counts(b) or "none"),
        ("best", best_value(a), best_value(b)),
    ]
    best_a, best_b = a.best(), b.best()
    rows.append(("baseline", _baseline(best_a), _baseline(best_b)))
    params = list(dict.fromkeys([*_params(best_a), *_params(best_b)]))
    for name in params:
        rows.append(
            (name, show_cell(_params(best_a).get(name)), show_cell(_params(best_b).get(name)))
        )
    key = StudyAttr.FIXED_OVERRIDES
    fixed_a, fixed_b = a.attrs.get(key) or [], b.attrs.get(key) or []
    if fixed_a or fixed_b:
        rows.append(("fixed overrides", " ".join(fixed_a) or "-", " ".join(fixed_b) or "-"))
    return rows


def compare_text(a: StudyData, b: StudyData) -> str:
    return text_table(compare_rows(a, b))


def _params(best: Any) -> dict[str, Any]:
    return dict(best.params) if best is not None else {}


def _baseline(best: Any) -> str:
    return show_num(best.baseline, 3) if best is not None else "-"
