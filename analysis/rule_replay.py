"""Replay health rules on finished runs: what each rule would have pruned or warned, against
each run's label from its whole curve (curve_labels), at a chosen eval cadence.

`python -m analysis rules` reads the runs of a study (MLflow) or the recorded-curve library's
JSON files (bench/record_curves.py) and prints, per rule and for the rules together: would-be
prunes, catches of broken runs, false prunes of learning runs, and the median delay from the
break to the stop, each rate with its 95% Wilson interval and its counts. The rules are
trainer/run/health.py's, run through its HealthMonitor: the decisions a sweep would make.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.curve_labels import (
    BROKE_DOWN,
    BROKEN,
    COLLAPSED,
    ENDED_UP,
    FLAT,
    HACKED,
    LEARNING,
    Label,
    Point,
    ending,
    label,
)
from analysis.load import StudyData, history
from analysis.load import _training_runs as training_runs
from analysis.proportions import clustered_interval, rate, shown_share
from records import metrics as names
from records.metrics import is_finite_number
from records.sweep import StudyAttr
from trainer.base.config import TrainConfig
from trainer.run.health import SYMPTOMS, HealthRule, replay_run, rules_from_settings

Steps = dict[int, dict[str, float]]  # {step: metrics}
EVAL_PREFIX = "eval/"


@dataclass
class Run:
    """One finished run: its metrics by step and what its label reads."""

    run: str
    steps: Steps
    heldout_metric: str = names.EVAL_REWARD
    eval_size: int | None = None  # for a binomial stderr where none was logged
    batch_size: int = TrainConfig.batch_size  # problems a step: the training reward's noise
    part: str = ""  # calibration / heldout (the library), "" for a study's runs
    complete: bool = True  # a pruned or failed trial's curve is cut: it has no label
    error: str | None = None  # the library's run that blew up (non-finite): a collapse
    eval_every: int = 1  # the cadence it was recorded at: a replay's must be a multiple
    recorded_densely: bool = False  # the library's: an eval on demand comes from its recording

    def __post_init__(self) -> None:
        """The held-out metric's standard error where a recording lacks it (the library's
        older runs logged none for a reward part): what the trainer logs now, from eval_size.
        The steps given are not changed: a step that needs it gets a copy."""
        key = names.stderr_of(self.heldout_metric)

        def lacks(m: Mapping[str, float]) -> bool:
            return is_finite_number(m.get(self.heldout_metric)) and not is_finite_number(m.get(key))

        self.steps = {
            s: {**m, key: eval_stderr(self, m)} if lacks(m) else m for s, m in self.steps.items()
        }

    @property
    def last_step(self) -> int:
        return max(self.steps)


@dataclass(frozen=True)
class Outcome:
    """What the rules did on one run."""

    run: str
    label: str | None  # None: the curve is cut, no label
    broke_at: int | None
    pruned_at: int | None
    pruned_by: str | None
    warned: dict[str, int]  # warning rule -> its first step (before any prune)
    last_step: int
    ending: str | None = None  # ENDED_UP, BROKE_DOWN or None: counted whatever the label
    cluster: str = ""  # runs that share it (a seed) are not independent for an interval

    @property
    def stop(self) -> int | None:
        """The step a prune, or a warning that the run broke (not a GRPO symptom's), first
        fired."""
        said = [step for rule, step in self.warned.items() if rule not in SYMPTOMS]
        return min([*said, *filter(None, [self.pruned_at])], default=None)


def at_cadence(steps: Steps, every: int) -> Steps:
    """The run as a sweep at `eval_every=every` would have seen it: eval metrics kept at step
    0, every `every`-th step and the last step only (an eval never changes training)."""
    last = max(steps)
    return {
        s: {
            k: v
            for k, v in m.items()
            if not k.startswith(EVAL_PREFIX) or _evaluated(s, every, last)
        }
        for s, m in steps.items()
    }


def _evaluated(step: int, every: int, last: int) -> bool:
    return step in (0, last) or (every > 0 and step % every == 0)


def run_rules(
    rules: Sequence[HealthRule], steps: Steps, evals: Steps | None = None
) -> tuple[Any, dict[str, int]]:
    """The first pruning breach (or None) and each warning rule's first step before it:
    health.py's own replay, the monitor a sweep runs (with `evals` on demand)."""
    breach, fired = replay_run(rules, steps, evals)
    return breach, {b.rule: b.step for b in fired}


def evals_on_demand(run: Run) -> Steps:
    """The eval a trainer would run on demand at each step (HealthMonitor.wants_eval). A
    library run's recording lends the step's own, else the next one recorded (one step late on
    a run recorded every 2 steps before record_curves' --dense-until). A study's run lends only
    the evals it logged, at their own steps (those it ran on demand among them): elsewhere
    the early gate decides."""
    evals, latest = {}, None
    for step in sorted(run.steps, reverse=True):
        own = {k: v for k, v in run.steps[step].items() if k.startswith(EVAL_PREFIX)}
        latest = own or (latest if run.recorded_densely else None)
        if latest:
            evals[step] = latest
    return evals


def heldout_points(run: Run) -> list[Point]:
    return [
        Point(s, m[run.heldout_metric], eval_stderr(run, m))
        for s, m in sorted(run.steps.items())
        if is_finite_number(m.get(run.heldout_metric))
    ]


def run_ending(run: Run) -> str | None:
    """The run's end (curve_labels.ending); one that blew up broke down."""
    if run.error:
        return BROKE_DOWN
    return ending(heldout_points(run)) if run.complete else None


def seed_cluster(run: Run) -> str:
    """A library run's seed (`...-seed<s>`): its runs share their problems and draws."""
    tail = run.run.rsplit("-seed", 1)
    return tail[1] if len(tail) == 2 else run.run


def labelled(run: Run) -> Label | None:
    if run.error:
        return Label(COLLAPSED, run.last_step, f"not finite at step {run.last_step}")
    if not run.complete:
        return None
    held = heldout_points(run)
    train = [
        Point(s, m[names.REWARD], m.get(names.REWARD_STD, 0.0) / math.sqrt(run.batch_size))
        for s, m in sorted(run.steps.items())
        if s > 0 and is_finite_number(m.get(names.REWARD))
    ]
    return label(held, train) if len(held) >= 2 else None


def eval_stderr(run: Run, m: Mapping[str, float]) -> float:
    """The held-out metric's logged standard error, else binomial over eval_size."""
    logged = m.get(names.stderr_of(run.heldout_metric))
    if is_finite_number(logged):
        return logged
    p = min(max(m[run.heldout_metric], 0.0), 1.0)  # a 0/1 reward part: binomial
    return math.sqrt(p * (1 - p) / (run.eval_size or 1))


def outcome(rules: Sequence[HealthRule], run: Run, every: int, lab: Label | None) -> Outcome:
    breach, warned = run_rules(rules, at_cadence(run.steps, every), evals_on_demand(run))
    return Outcome(
        run.run,
        lab.label if lab else None,
        lab.broke_at if lab else None,
        breach.step if breach else None,
        breach.rule if breach else None,
        warned,
        run.last_step,
        run_ending(run),
        seed_cluster(run),
    )


@dataclass
class Tally:
    """One rule set's record over the labelled runs."""

    name: str
    runs: int = 0
    prunes: int = 0
    learning: int = 0
    false_prunes: int = 0
    flat: int = 0
    flat_pruned: int = 0  # neither broken nor learning, stopped: a cheap loss, counted apart
    broken: int = 0
    caught: int = 0  # broken runs pruned or warned
    caught_pruned: int = 0
    caught_as_required: int = 0  # collapsed or broke: pruned; hacked: pruned or warned
    delays: list[float] = field(default_factory=list)  # (stop - break) / run length
    steps: int = 0  # trial-steps the runs took unpruned
    saved: int = 0  # trial-steps after the prunes: what pruning saved
    # Counted on each run's end, whatever its label (curve_labels.ending), by cluster (seed):
    # {cluster: [ended up, of those pruned, broke down, of those neither pruned nor warned]}
    ends: dict[str, list[int]] = field(default_factory=dict)
    errors_by_label: dict[str, int] = field(default_factory=dict)

    def add(self, o: Outcome) -> None:
        self.runs += 1
        pruned = o.pruned_at is not None
        counts = self.ends.setdefault(o.cluster, [0, 0, 0, 0])
        if o.ending == ENDED_UP:
            counts[0] += 1
            counts[1] += pruned
        if o.ending == BROKE_DOWN:
            counts[2] += 1
            counts[3] += o.stop is None
        if (o.ending == ENDED_UP and pruned) or (o.ending == BROKE_DOWN and o.stop is None):
            key = o.label or "unlabelled"
            self.errors_by_label[key] = self.errors_by_label.get(key, 0) + 1
        self.prunes += pruned
        self.steps += o.last_step
        self.saved += o.last_step - o.pruned_at if pruned else 0
        if o.label == LEARNING:
            self.learning += 1
            self.false_prunes += pruned
        if o.label == FLAT:
            self.flat += 1
            self.flat_pruned += pruned
        if o.label in BROKEN:
            self.broken += 1
            self.caught_pruned += pruned
            self.caught_as_required += pruned or (o.label == HACKED and o.stop is not None)
            if o.stop is not None:
                self.caught += 1
                if o.broke_at is not None:
                    self.delays.append((o.stop - o.broke_at) / max(o.last_step, 1))

    def ended_up(self) -> tuple[int, int, tuple[float, float]]:
        """Runs that ended up and were pruned, of all that ended up, with a clustered 95%
        interval: the false prunes, whatever the label."""
        return self._share(0, 1)

    def missed(self) -> tuple[int, int, tuple[float, float]]:
        """Runs that broke down and were neither pruned nor warned, of all that broke down."""
        return self._share(2, 3)

    def _share(self, total: int, hit: int) -> tuple[int, int, tuple[float, float]]:
        clusters = {c: (v[hit], v[total]) for c, v in self.ends.items()}
        hits, n = sum(h for h, _ in clusters.values()), sum(m for _, m in clusters.values())
        return hits, n, clustered_interval(clusters)

    @property
    def median_delay(self) -> float | None:
        return statistics.median(self.delays) if self.delays else None

    def line(self) -> str:
        delay = "-" if self.median_delay is None else f"{self.median_delay:+.0%}"
        saved = f"{self.saved / self.steps:.0%}" if self.steps else "-"
        return (
            f"{self.name:<28} {self.prunes:>6}  {shown_share(*self.ended_up()):<21} "
            f"{shown_share(*self.missed()):<21} "
            f"{rate(self.caught_as_required, self.broken):<21} {delay:>6} "
            f"{f'{self.flat_pruned}/{self.flat}':>6} {saved:>6}"
        )


HEADER = (
    f"{'rules':<28} {'prunes':>6}  {'pruned/ended up':<21} {'missed/broke down':<21} "
    f"{'caught as required':<21} {'delay':>6} {'flat':>6} {'saved':>6}"
)


# The rules to replay: one list for every run, or a list a run (the defaults read each run's
# own held-out reward: `for_objective`).
Rules = Sequence[HealthRule] | Callable[[Run], Sequence[HealthRule]]


def for_objective(make: Callable[[str], Sequence[HealthRule]]) -> Callable[[Run], list]:
    """Rules built for each run's held-out metric, as a sweep with that objective builds them."""
    return lambda run: list(make(run.heldout_metric))


def rules_of(rules: Rules, run: Run) -> Sequence[HealthRule]:
    return rules(run) if callable(rules) else rules


def tallies(rules: Rules, runs: Sequence[Run], every: int) -> list[Tally]:
    """One tally per rule alone, then one for the rules together."""
    out: list[Tally] = []
    for run in runs:
        lab = labelled(run)
        given = rules_of(rules, run)
        if not out:
            out = [Tally(rule.name) for rule in given] + [Tally("all together")]
        for rule, tally in zip(given, out, strict=False):
            tally.add(outcome([rule], run, every, lab))
        out[-1].add(outcome(given, run, every, lab))
    return out


def replay_table(rules: Rules, runs: Iterable[Run], every: int) -> list[str]:
    """The report: the label counts, then a line per rule alone and the rules together.
    Delay: the median of (first stop - the label's break step) over the run's length."""
    runs = list(runs)
    counts: dict[str, int] = {}
    for run in runs:
        lab = labelled(run)
        key = lab.label if lab else "unlabelled (cut short)"
        counts[key] = counts.get(key, 0) + 1
    shown = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    return [
        f"{len(runs)} runs at eval_every={every}: {shown}",
        "counted on each run's end whatever its label, 95% intervals clustered by seed: runs "
        "that ended up (last 3 evals at or above baseline + 1 se) pruned; runs that broke down "
        "(below baseline and their best) neither pruned nor warned. By label (Wilson): caught "
        "as required (collapsed, learned-then-broke pruned; hacked pruned or warned); delay: "
        "median (stop - break) / run steps; flat runs pruned; saved: trial-steps after prunes",
        HEADER,
        *(t.line() for t in tallies(rules, runs, every)),
    ]


def cadence_problem(runs: Iterable[Run], every: int) -> str | None:
    """Why `every` cannot be replayed exactly on these runs (an eval between their recorded
    ones), or None."""
    recorded = {r.eval_every for r in runs if every % r.eval_every}
    if not recorded:
        return None
    return (
        f"--eval-every={every}: some runs were recorded with an eval every {min(recorded)} "
        f"steps; replay a multiple of it"
    )


def load_library(paths: Iterable[Path], part: str | None = None) -> list[Run]:
    """The recorded-curve library's runs (bench/record_curves.py's JSON files, or folders of
    them), only those of `part` when given."""
    files = [f for p in paths for f in (sorted(p.glob("*.json")) if p.is_dir() else [p])]
    runs = [library_run(json.loads(f.read_text())) for f in files]
    return [r for r in runs if part in (None, r.part)]


def library_run(data: Mapping[str, Any]) -> Run:
    steps = {
        int(s): {k: float(v) for k, v in m.items() if isinstance(v, int | float | str)}
        for s, m in data["steps"].items()
    }
    batch = next(
        (int(o.split("=", 1)[1]) for o in data.get("overrides", []) if o.startswith("batch_size=")),
        data.get("batch_size", TrainConfig.batch_size),
    )
    return Run(
        data["run"],
        steps,
        data.get("heldout_metric", names.EVAL_REWARD),
        data.get("eval_size"),
        batch,
        data.get("part", ""),
        error=data.get("error"),
        eval_every=data.get("eval_every", 1),
        recorded_densely=True,
    )


def study_rules(attrs: Mapping[str, Any]) -> list[HealthRule] | None:
    """The rules a study pruned by (stored in its attributes), or None when it stored none."""
    stored = attrs.get(StudyAttr.HEALTH_RULES)
    if stored is None:
        return None
    kl = attrs.get(StudyAttr.KL_THRESHOLD) or TrainConfig.kl_threshold
    return rules_from_settings(stored, kl)


def study_runs(data: StudyData, client: Any) -> list[Run]:
    """Every training run (one per seed) of a study's trials, each metric's whole history;
    runs of trials that did not complete are kept unlabelled (their curves are cut)."""
    runs = []
    states = {t.number: t.state for t in data.trials}
    for number, seeds in sorted(training_runs(client, data).items()):
        for seed, run_id in sorted(seeds.items()):
            keys = client.get_run(run_id).data.metrics
            steps: Steps = {}
            for key in keys:
                for step, value in history(client, run_id, key):
                    steps.setdefault(step, {})[key] = value
            if steps:
                name = f"t{number}" + (f" seed {seed}" if data.seeds > 1 else "")
                complete = states.get(number) == "complete"
                runs.append(Run(name, steps, data.objective, complete=complete))
    return runs
