"""The verdict: a terminal leaderboard and a self-contained HTML report.

The HTML embeds its figures as base64 data URIs (the PNGs are written next to it too), so
it opens from disk, by e-mail or as an MLflow artifact, with no server or network.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from analysis.advice import Advice, advise, below_baseline
from analysis.load import StudyData, TrialRecord
from analysis.plots import FIGURES, draw_all
from analysis.text import show_cell, show_num, text_table
from analysis.verdict import INTERVAL_HEADER, interval_cells, study_verdict
from records.metrics import is_finite_number, titled
from records.sweep import StudyAttr

STATE_ORDER = {"complete": 0, "running": 1, "pruned": 2, "failed": 3, "waiting": 4}


# --- the leaderboard ------------------------------------------------------------------


def ranked(data: StudyData) -> list[TrialRecord]:
    """Completed trials best first, then running, pruned (by last eval), failed, queued."""
    sign = -1 if data.direction == "maximize" else 1

    def key(t: TrialRecord) -> tuple:
        score = t.value if t.value is not None else t.last_eval
        score = sign * score if is_finite_number(score) else math.inf
        return (STATE_ORDER.get(t.state, 9), score, t.number)

    return sorted(data.trials, key=key)


def leaderboard_rows(data: StudyData) -> tuple[list[str], list[list[str]]]:
    names = data.param_names
    header = ["trial", *names, *INTERVAL_HEADER, "state", "steps", "final KL", "baseline", "note"]
    summaries = {s.label: s for s in study_verdict(data.study, data.attrs, data.maximize).ranked}
    rows = []
    for t in ranked(data):
        params = [show_cell(t.params.get(n)) for n in names]
        rows.append(
            [
                f"t{t.number}",
                *params,
                *interval_cells(summaries.get(f"t{t.number}")),
                t.state,
                show_cell(t.steps_run),
                show_num(t.final_kl, 3),
                show_num(t.baseline, 3),
                t.note or ("ended below its baseline" if below_baseline(t, data.maximize) else ""),
            ]
        )
    return header, rows


def leaderboard_text(data: StudyData) -> str:
    header, rows = leaderboard_rows(data)
    return text_table([header, *rows])


def summary_lines(data: StudyData) -> list[str]:
    """Study, counts, best trial, and the message when nothing completed."""
    counts = {s: len(data.by_state(s)) for s in STATE_ORDER}
    shown = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    lines = [
        f"Study {data.name} ({data.storage}): {len(data.trials)} trials ({shown or 'none'})",
        f"Objective: {data.direction} {titled(data.objective)}; health rules: {health_rules(data)}",
    ]
    if data.best() is not None:
        lines += study_verdict(data.study, data.attrs, data.maximize).lines
    else:
        lines.append(no_best_message(data))
    return lines


def health_rules(data: StudyData) -> str:
    rules = data.attrs.get(StudyAttr.HEALTH_RULES)
    if rules is None:
        return f"{data.kl_metric} > {show_cell(data.kl_threshold)}"
    return ", ".join(r.get("name", "?") for r in rules) or "none (no pruning on health)"


def no_best_message(data: StudyData) -> str:
    if not data.trials:
        return "No trials yet: the study is empty."
    if data.by_state("running", "waiting") and not data.by_state("failed", "pruned"):
        return "No completed trial yet: the study is still running."
    failed, pruned = data.by_state("failed"), data.by_state("pruned")
    parts = [f"{len(failed)} failed" if failed else "", f"{len(pruned)} pruned" if pruned else ""]
    text = f"No completed trial: {', '.join(p for p in parts if p)}."
    if failed and len(failed) == len(data.trials):
        text = f"No completed trial: all {len(failed)} trials failed."
    if failed:
        text += f" First failure (t{failed[0].number}): {failed[0].note}"
    return text


# --- HTML -----------------------------------------------------------------------------

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }
th { background: #f0f0f0; }
tr.complete td:first-child { border-left: 4px solid #2a7; }
tr.pruned { color: #865; } tr.failed { color: #a33; } tr.running { color: #357; }
tr.best { font-weight: bold; background: #fff4e5; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }
.note { color: #666; font-style: italic; } .advice li { margin-bottom: 0.5em; }
"""


def render_html(data: StudyData, figures: dict[str, Path | str], advice: Sequence[Advice]) -> str:
    best = data.best()
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Sweep report: {_e(data.name)}</title><style>{CSS}</style></head><body>",
        f"<h1>Sweep report: {_e(data.name)}</h1>",
        "<p>" + "<br>".join(_e(line) for line in summary_lines(data)) + "</p>",
    ]
    parts += [f'<p class="note">{_e(n)}</p>' for n in data.notes]
    parts.append("<h2>What to try next</h2>")
    if advice:
        items = "".join(f"<li><b>{_e(a.title)}</b><br>{_e(a.why)}</li>" for a in advice)
        parts.append(f'<ul class="advice">{items}</ul>')
    else:
        parts.append('<p class="note">No rule of thumb fired: nothing obviously off.</p>')
    parts += ["<h2>Leaderboard</h2>", _html_table(data, best)]
    for name, (title, _) in FIGURES.items():
        parts.append(f"<h2>{_e(title)}</h2>")
        parts.append(_figure(name, title, figures.get(name, "not drawn")))
    parts.append("</body></html>")
    return "\n".join(parts)


def _html_table(data: StudyData, best: TrialRecord | None) -> str:
    header, rows = leaderboard_rows(data)
    out = ["<table><thead><tr>", *(f"<th>{_e(h)}</th>" for h in header), "</tr></thead><tbody>"]
    for t, row in zip(ranked(data), rows, strict=True):
        cls = t.state + (" best" if best is not None and t.number == best.number else "")
        out.append(f'<tr class="{cls}">' + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _figure(name: str, title: str, result: Path | str) -> str:
    if isinstance(result, str):
        return f'<p class="note">Skipped: {_e(result)}</p>'
    encoded = base64.b64encode(result.read_bytes()).decode("ascii")
    return (
        f'<img id="fig-{name}" alt="{_e(title)}" src="data:image/png;base64,{encoded}">'
        f'<br><a href="{_e(result.name)}">{_e(result.name)}</a>'
    )


def write_report(data: StudyData, out_dir: Path) -> Path:
    """PNG figures and index.html in out_dir; returns the HTML's path."""
    figures = draw_all(data, out_dir)
    page = out_dir / "index.html"
    page.write_text(render_html(data, figures, advise(data)), encoding="utf-8")
    return page


def advice_text(advice: Sequence[Advice]) -> str:
    if not advice:
        return "What to try next: no rule of thumb fired."
    return "What to try next:\n" + "\n".join(f"  - {a.title}: {a.why}" for a in advice)


def _e(text: Any) -> str:
    return html.escape(str(text))
