"""What the user watches: a one-line progress after each trial and a final table."""

from __future__ import annotations

import sys

import optuna
from optuna.trial import FrozenTrial, TrialState

from analysis.records import StudyAttr, best_trial, trial_note
from analysis.text import show_value, text_table
from analysis.verdict import (
    INTERVAL_HEADER,
    Summary,
    Verdict,
    interval_cells,
)
from sweeper.study.slots import Counts


def progress_line(study: optuna.Study, planned: int, maximize: bool) -> str:
    c = Counts.of(study)
    best = best_trial(study.get_trials(deepcopy=False), maximize)
    best_text = f"{best.value:.3g} (t{best.number})" if best else "-"
    running = f", {c.running} running" if c.running else ""
    return (
        f"[sweep {study.study_name}] {c.done}/{planned} done "
        f"({c.pruned} pruned, {c.failed} failed{running}) best={best_text}"
    )


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def final_table(study: optuna.Study, verdict: Verdict) -> str:
    """Every trial: number, params, seeds, mean and 95% CI (completed ones), state and, for
    pruned or failed ones, why; then the verdict."""
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    names = list(dict.fromkeys(k for t in trials for k in t.params))
    summaries = {s.label: s for s in verdict.ranked}
    header = ["trial", *names, *INTERVAL_HEADER, "state", "note"]
    not_run = (
        "not run: the terminator stopped the search"
        if study.user_attrs.get(StudyAttr.STOPPED)
        else ""
    )
    rows = [_row(t, names, summaries.get(f"t{t.number}"), not_run) for t in trials]
    return text_table([header, *rows]) + "\n\n" + verdict.text


def _row(trial: FrozenTrial, names: list[str], summary: Summary | None, not_run: str) -> list[str]:
    params = [show_value(trial.params[n]) if n in trial.params else "" for n in names]
    return [
        f"t{trial.number}",
        *params,
        *interval_cells(summary),
        trial.state.name,
        trial_note(trial) or (not_run if trial.state == TrialState.WAITING else ""),
    ]
