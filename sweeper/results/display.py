"""What the user watches: a one-line progress after each trial and a final table."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from analysis.text import show_value, text_table, trial_note
from analysis.verdict import (
    INTERVAL_HEADER,
    Summary,
    Verdict,
    interval_cells,
)
from records.sweep import StudyAttr, best_trial, is_interrupted


@dataclass
class Counts:
    """The study's trials by outcome, all workers together. Interrupted trials (killed,
    Ctrl-C) gave their slot back, so they count toward nothing."""

    complete: int = 0
    pruned: int = 0
    failed: int = 0
    running: int = 0
    waiting: int = 0

    @classmethod
    def of(cls, study: optuna.Study) -> Counts:
        counts = cls()
        for t in study.get_trials(deepcopy=False):
            if not is_interrupted(t):
                name = "failed" if t.state == TrialState.FAIL else t.state.name.lower()
                setattr(counts, name, getattr(counts, name) + 1)
        return counts

    @property
    def done(self) -> int:
        return self.complete + self.pruned + self.failed

    @property
    def slots(self) -> int:
        """Places of the plan taken so far: finished, running or queued."""
        return self.done + self.running + self.waiting


def progress_line(study: optuna.Study, planned: int, maximize: bool) -> str:
    c = Counts.of(study)
    best = best_trial(study.get_trials(deepcopy=False), maximize)
    best_text = f"{best.value:.3g} (t{best.number})" if best else "-"
    running = f", {c.running} running" if c.running else ""
    return (
        f"[sweep {study.study_name}] {c.done}/{planned} done "
        f"({c.pruned} pruned, {c.failed} failed{running}) best={best_text}"
    )


def short(params: dict) -> str:
    """`lr=0.002346 group_size=4`: a searched float to 4 significant digits, for the terminal
    (run names and tuned files keep every digit)."""
    return " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={show_value(v)}"
        for k, v in params.items()
    )


# Loggers whose INFO lines the sweep's own lines replace on the terminal: Hydra's launch line
# (with the internal trial.* overrides, kept in MLflow and the study), Optuna's "study
# created", MLflow's store setup, transformers' weight-loading bar. `hydra.verbose=true` keeps them.
CHATTY = ("hydra._internal.core_plugins.basic_launcher", "optuna", "mlflow")


def quiet_third_party(verbose) -> None:
    if verbose:
        return
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.WARNING)
    from transformers.utils import logging as transformers_logging  # the trials load it anyway

    transformers_logging.disable_progress_bar()  # "Loading weights" at every trial's start


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
