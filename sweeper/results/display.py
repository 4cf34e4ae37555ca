"""What the user watches: one line per trial (live on a terminal), a sweep-level progress
line after each trial, and a final table.

On a terminal a trial's line is redrawn in place with its step, steps/s and ETA, then ends
as its outcome; on a pipe (CI, a log) it is the start and the end line, no carriage returns.
The trainer's own INFO lines and progress bar go to the trial's log file
(`multirun/<date>/<time>/t<n>/__main__.log`); `hydra.verbose=true` shows them here too.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TextIO

import optuna
from optuna.trial import FrozenTrial, TrialState

from analysis.text import settings, show_value, text_table, trial_note
from analysis.verdict import (
    INTERVAL_HEADER,
    Summary,
    Verdict,
    interval_cells,
)
from judge.configs import at_floor
from records.metrics import REWARD
from records.sweep import (
    Replicate,
    State,
    StudyAttr,
    TrialAttr,
    best_trial,
    is_interrupted,
    replicates,
)


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
    """`lr=0.002346 group_size=4`: a trial's settings on the terminal (analysis.text.settings)."""
    return settings(params, " ")


# Loggers whose INFO lines the sweep's own lines replace on the terminal: Hydra's launch line
# (with the internal trial.* overrides, kept in MLflow and the study), Optuna's "study
# created", MLflow's store setup. `hydra.verbose=true` keeps them.
CHATTY = ("hydra._internal.core_plugins.basic_launcher", "optuna", "mlflow")


def quiet_third_party(verbose) -> None:
    if verbose:
        return
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.WARNING)


def trial_output_to_log(verbose) -> None:
    """In a sweep's trial: the trainer's INFO lines and progress bar go to the trial's log
    file only (Hydra's console handler keeps its warnings); `hydra.verbose=true` keeps all."""
    if verbose:
        return
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(
            handler, logging.FileHandler
        ):
            handler.setLevel(logging.WARNING)
            if SAID_ONCE not in handler.filters:  # Hydra makes new handlers for every job
                handler.addFilter(SAID_ONCE)
            if on_terminal(handler.stream):  # a warning takes the place of the live line
                handler.setFormatter(OverLiveLine(handler.formatter))
    from transformers.utils import logging as transformers_logging  # the trial loads it anyway

    from trainer.base.progress import bars_to_log

    transformers_logging.disable_progress_bar()  # "Loading weights" at every trial's start
    bars_to_log()


class OnceASweep(logging.Filter):
    """A warning said once on the terminal, not once a trial: the jobs of a sweep share this
    process (the trial process, or the sweep's own), so the same line from every trial's run
    ("these health rules never fire: ...") is said by the first. Every trial's log file keeps
    it (the filter is on the console handler only)."""

    def __init__(self) -> None:
        super().__init__()
        self.said: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.getMessage())
        if key in self.said:
            return False
        self.said.add(key)
        return True


SAID_ONCE = OnceASweep()


class OverLiveLine(logging.Formatter):
    """A console record on a terminal, written over a trial's live line (cleared first)."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        return "\r\x1b[K" + self.inner.format(record)


def say(line: str) -> None:
    """A line of the sweep's; on a terminal it takes the place of a trial's live line."""
    print(f"\r\x1b[K{line}" if on_terminal() else line, file=sys.stderr, flush=True)


def on_terminal(stream: TextIO | None = None) -> bool:
    stream = stream or sys.stderr
    return hasattr(stream, "isatty") and stream.isatty()


def say_started(study_name: str, number: int, params: dict, live: bool) -> None:
    """A trial's first line: on a terminal, with its live line to come (`live`: the trial
    runs in this process, alone), left open for it to redraw."""
    line = f"[sweep {study_name}] t{number} {short(params)}".rstrip() + " started"
    if live and on_terminal():
        print(f"\r{line}", end="", file=sys.stderr, flush=True)
    else:
        say(line)


def end_line(study_name: str, trial: FrozenTrial, counts: str = "") -> str:
    """A trial's last line: its value and why its race ended (the headline: the evidence is on
    its MLflow run), or why it was pruned or failed; then `counts` (progress_counts)."""
    line, race = _ended(study_name, trial), _raced(trial)  # _raced: "" unless COMPLETE
    if race:  # whom it is tied with: the table
        line += f"; {race.split(',')[0]}"
    return f"{line} {counts}" if counts else line


def progress_counts(study: optuna.Study, planned: int) -> str:
    """`(2/4 done)`, with the pruned and failed ones when there are any."""
    c = Counts.of(study)
    broken = [f"{n} {what}" for n, what in ((c.pruned, "pruned"), (c.failed, "failed")) if n]
    return f"({c.done}/{planned} done{', ' if broken else ''}{', '.join(broken)})"


def _ended(study_name: str, trial: FrozenTrial) -> str:
    head = f"[sweep {study_name}] t{trial.number} {short(trial.params)}".rstrip()
    steps = trial.user_attrs.get(TrialAttr.STEPS_RUN)
    at = f" at step {steps}" if steps is not None else ""
    took = ""
    if trial.datetime_start and trial.datetime_complete:
        took = f" in {(trial.datetime_complete - trial.datetime_start).total_seconds():.0f} s"
    if trial.state == TrialState.COMPLETE:
        return f"{head}: {trial.value:.4g} after {steps} steps{took}"
    if trial.state == TrialState.PRUNED:
        return f"{head}: pruned{at}{took}: {trial_note(trial)}"
    if trial.state == TrialState.FAIL:
        return f"{head}: failed{at}{took}: {trial_note(trial)}"
    return f"{head}: {trial.state.name.lower()}"


_INLINE = False  # this process's sweep runs its trials here, one at a time


def trials_run_here() -> None:
    """Said by the sweep when its launcher runs each trial in its own process, alone: then a
    trial's line may be live (in a launcher's workers, two trials would fight over one)."""
    global _INLINE
    _INLINE = True


# On a pipe (a CI log) a running trial says where it is at most this often, as Ray Tune's
# progress table does: minutes of `started` lines alone read like a hang.
PIPE_INTERVAL_S = 30.0


class TrialLine:
    """A trial's live line on a terminal: `t1 lr=0.002 step 12/50, 1.9 step/s, ETA 20 s,
    reward 0.31`, redrawn in place at most every `interval` seconds, when the sweep runs its
    trials in this process (trials_run_here). On a pipe the same text is a line of its own,
    at most every PIPE_INTERVAL_S seconds (none for a trial that ends sooner)."""

    def __init__(
        self,
        head: str,
        max_steps: int,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        interval: float = 0.2,
    ) -> None:
        self.head, self.max_steps, self.clock = head, max_steps, clock
        self.stream = stream or sys.stderr
        terminal = on_terminal(self.stream)
        self.live = terminal and _INLINE
        self.interval = interval if terminal else PIPE_INTERVAL_S
        self.first: tuple[int, float] | None = None  # (step, time) when training began
        self.drawn_at = -float("inf")

    def step(self, step: int, metrics: Mapping[str, float]) -> None:
        if self.live:
            self._redraw(step, metrics)
        elif not on_terminal(self.stream):
            self._log(step, metrics)

    def _redraw(self, step: int, metrics: Mapping[str, float]) -> None:
        now = self.clock()
        if self.first is None:  # step 0 is the baseline eval: the rate counts from here
            self.first = (step, now)
            return
        if now - self.drawn_at < self.interval and step < self.max_steps:
            return
        self.drawn_at = now
        self.stream.write(f"\r\x1b[K{self.text(step, now, metrics)}")
        self.stream.flush()

    def _log(self, step: int, metrics: Mapping[str, float]) -> None:
        now = self.clock()
        if self.first is None:  # the baseline eval: the first line comes an interval later
            self.first, self.drawn_at = (step, now), now
            return
        if now - self.drawn_at < self.interval or step >= self.max_steps:
            return  # the trial's end line follows the last step
        self.drawn_at = now
        self.stream.write(self.text(step, now, metrics) + "\n")
        self.stream.flush()

    def text(self, step: int, now: float, metrics: Mapping[str, float]) -> str:
        first_step, first_time = self.first or (step, now)
        rate = (step - first_step) / (now - first_time) if now > first_time else 0.0
        parts = [f"step {step}/{self.max_steps}"]
        if rate > 0:
            eta = (self.max_steps - step) / rate
            parts += [f"{rate:.2g} step/s", f"ETA {eta:.0f} s"]
        if REWARD in metrics:
            parts.append(f"reward {metrics[REWARD]:.2f}")
        return f"{self.head} " + ", ".join(parts)


def final_table(study: optuna.Study, verdict: Verdict, verbose: bool = False) -> str:
    """The verdict in three parts: its decision; every trial (number, params, seeds, mean and
    95% CI of completed ones, state and, for pruned or failed ones, why; for raced ones why
    their race ended); what to run next. verbose: the statistics behind it after that."""
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
    after = [verdict.next_step, *(verdict.detail if verbose else [])]
    return "\n".join([verdict.decision, "", text_table([header, *rows]), "", *after])


# The grid a sweep's cost is compared with: every configuration at 3 seeds, what careful
# papers run. First the one this tool runs with `seeds=3` and the same health rules (a seed a
# rule stops ends early; it counts at the floor and the next seed starts, or, with no floor,
# no later seed of its configuration starts), then the plain one (bench/COST.md measures the
# default race against both).
GRID_SEEDS = 3
LINE = 120  # the widest a terminal line is kept (tests/test_readme_commands.py)


@dataclass(frozen=True)
class GridCost:
    """What the seeds=GRID_SEEDS grid with the same health rules would have spent on one
    configuration: steps, and how many of them are estimated (its seeds not run here)."""

    steps: float
    estimated: float


def with_rules_grid(
    seeds: Mapping[int, Replicate], max_steps: int, floor: float | None = None
) -> GridCost:
    """The grid's first GRID_SEEDS seeds of a configuration (the race runs them in the same
    order), at the steps the rules let them run: a seed that ran, its own steps_run; one a
    rule stopped goes on to the next seed when it counts at the floor (judge/configs.py),
    else it ends the configuration there (pruned uncounted, failed), as the grid would; a seed
    not run (or still running), the mean steps of the configuration's ended seeds that the
    grid would go on after (max_steps where there are none), estimated."""
    goes_on = [r for r in seeds.values() if r.state == State.COMPLETE or at_floor(r, floor)]
    guess = sum(r.steps_run or 0 for r in goes_on) / len(goes_on) if goes_on else float(max_steps)
    steps = estimated = 0.0
    ordered = sorted(seeds)
    for i in range(GRID_SEEDS):
        r = seeds[ordered[i]] if i < len(ordered) else None
        if r is None or r.state not in (State.COMPLETE, State.PRUNED, State.FAIL):
            steps, estimated = steps + guess, estimated + guess
            continue
        steps += r.steps_run or 0
        if r not in goes_on:
            break
    return GridCost(steps, estimated)


def cost_line(trials: list[FrozenTrial], max_steps: int, floor: float | None = None) -> str:
    """What a grid sweep spent, in training steps over every seed run, against a grid of
    GRID_SEEDS seeds of the same configurations with the same health rules (with_rules_grid;
    the line says how much of it is estimated), then the plain grid where the line has room.
    A configuration queued again after an interrupt is one configuration, and a seed run
    carried over to it one run."""
    runs = {}
    by_config: dict[tuple, dict[int, Replicate]] = {}
    steps_of: dict[tuple, int] = {}
    for i, t in enumerate(trials):
        key = tuple(sorted(t.params.items()))
        steps_of[key] = int(t.params.get("max_steps", max_steps))
        seeds = by_config.setdefault(key, {})
        for r in replicates(t):
            runs.setdefault(r.run_id or (i, r.seed), r)
            seeds[r.seed] = r
    spent = sum(r.steps_run or 0 for r in runs.values())
    head = f"Cost: {spent:,} training steps in {len(runs)} runs"
    plain = sum(GRID_SEEDS * n for n in steps_of.values())
    if not plain:
        return head + "."
    grid = [with_rules_grid(by_config[k], steps_of[k], floor) for k in steps_of]
    ruled, estimated = round(sum(g.steps for g in grid)), round(sum(g.estimated for g in grid))
    guessed = f" ({estimated:,} estimated)" if estimated else ""
    if ruled == plain:
        return (
            f"{head}, {spent / plain:.0%} of the {plain:,} a {GRID_SEEDS}-seed grid takes, "
            f"health rules or not{guessed}."
        )
    line = (
        f"{head}, {spent / ruled:.0%} of the {ruled:,} a {GRID_SEEDS}-seed grid takes with "
        f"these health rules{guessed}"
    )
    second = f"; {spent / plain:.0%} without"
    return f"{line}{second}." if len(line + second) < LINE else f"{line}."


def _row(trial: FrozenTrial, names: list[str], summary: Summary | None, not_run: str) -> list[str]:
    params = [show_value(trial.params[n]) if n in trial.params else "" for n in names]
    return [
        f"t{trial.number}",
        *params,
        *interval_cells(summary),
        trial.state.name,
        trial_note(trial)
        or (not_run if trial.state == TrialState.WAITING else "")
        or _raced(trial),
    ]


def _raced(trial: FrozenTrial) -> str:
    """Why a raced configuration got the seeds it got: its race's headline (the evidence after
    the colon is on its MLflow run and in the verdict's detail)."""
    race = trial.user_attrs.get(TrialAttr.RACE, "") if trial.state == TrialState.COMPLETE else ""
    return race.split(":")[0].split(";")[0]
