"""What the user watches: a one-line progress after each trial and a final table."""

from __future__ import annotations

import sys

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeper.records import best_trial, trial_note
from sweeper.slots import Counts
from sweeper.space import show_value
from sweeper.text import text_table


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


def final_table(study: optuna.Study) -> str:
    """Every trial: number, params, objective, state and, for pruned/failed, why."""
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    names = list(dict.fromkeys(k for t in trials for k in t.params))
    header = ["trial", *names, "objective", "state", "note"]
    return text_table([header] + [_row(t, names) for t in trials])


def _row(trial: FrozenTrial, names: list[str]) -> list[str]:
    params = [show_value(trial.params[n]) if n in trial.params else "" for n in names]
    value = f"{trial.value:.4g}" if trial.state == TrialState.COMPLETE else "-"
    return [f"t{trial.number}", *params, value, trial.state.name, trial_note(trial)]
