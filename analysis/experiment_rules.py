"""The health rules over the runs an MLflow experiment already holds: which rule would have
stopped each, at which step, and the steps that would have saved, per run and per rule
(`python -m analysis rules --experiment NAME`).

The runs may be a plain TRL script's (`report_to="mlflow"`: TRL's metric names and its
optimizer steps, read through the TRL backend's own mapping) or this project's (our names and
steps). The rules are trainer/run/health.py's, run through its HealthMonitor
(rule_replay.run_rules): the decision a sweep would have made on the same curve.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from analysis.load import AnalysisError, history
from analysis.rule_replay import Run, Steps, run_rules
from trainer.backends.trl.metric_names import logged_as_ours
from trainer.run.health import Breach, HealthRule

# The GRPOConfig params TRL's MLflow run records: a step of ours is a generation round
GENERATION_STEPS = "steps_per_generation"
ACCUMULATION = "gradient_accumulation_steps"


@dataclass(frozen=True)
class Stop:
    """Where the rules would have stopped one run."""

    run: str
    breach: Breach
    last_step: int

    @property
    def saved(self) -> int:
        return self.last_step - self.breach.step


def experiment_runs(client: Any, experiment: str) -> list[Run]:
    """Every run of the experiment with a per-step metric, under our names and steps."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise AnalysisError(f"--experiment={experiment!r}: no such MLflow experiment")
    runs = []
    for logged in client.search_runs([found.experiment_id], max_results=50000):
        steps = logged_steps(client, logged)
        if steps:
            name = logged.info.run_name or logged.info.run_id
            runs.append(Run(f"{name} ({logged.info.run_id[:8]})", steps))
    return runs


def logged_steps(client: Any, logged: Any) -> Steps:
    """A run's metrics by step of ours. A TRL run logs by optimizer step, a step of ours
    being steps_per_generation / gradient_accumulation_steps of them (its params say)."""
    params = logged.data.params
    substeps = 1
    if GENERATION_STEPS in params:
        substeps = max(1, int(params[GENERATION_STEPS]) // int(params.get(ACCUMULATION, 1)))
    steps: Steps = {}
    for key in logged.data.metrics:
        for step, value in history(client, logged.info.run_id, key):
            if step % substeps == 0:
                steps.setdefault(step // substeps, {})[logged_as_ours(key)] = value
    return steps


def stops(rules: Sequence[HealthRule], runs: Sequence[Run]) -> list[Stop]:
    """Each run a pruning rule would have stopped, in the runs' order."""
    found = []
    for run in runs:
        breach, _ = run_rules(rules, run.steps)
        if breach is not None:
            found.append(Stop(run.run, breach, run.last_step))
    return found


def stops_text(experiment: str, rules: Sequence[HealthRule], runs: Sequence[Run]) -> list[str]:
    """The answer first (how many runs the rules would have stopped, the steps saved), a line
    per stopped run, then the steps saved by each rule, the most first; a run no rule stops is
    not named."""
    stopped = stops(rules, runs)
    total = sum(run.last_step for run in runs)
    saved = sum(stop.saved for stop in stopped)
    share = f" ({saved / total:.0%})" if total else ""
    lines = [
        f"experiment {experiment}: the rules would have stopped {len(stopped)} of {len(runs)} "
        f"runs, saving {saved} of {total} steps{share}"
    ]
    stopped.sort(key=lambda stop: (-stop.saved, stop.run))  # the most saved first
    for stop in stopped:
        lines.append(
            f"  {stop.run}: {stop.breach.rule} at step {stop.breach.step} of {stop.last_step}, "
            f"{stop.saved} steps saved: {stop.breach}"
        )
    by_rule: dict[str, list[Stop]] = {}
    for stop in stopped:
        by_rule.setdefault(stop.breach.rule, []).append(stop)
    if by_rule:
        saved_by = {rule: sum(stop.saved for stop in found) for rule, found in by_rule.items()}
        each = [
            f"{rule} {saved_by[rule]} ({len(found)} run{'s' * (len(found) > 1)})"
            for rule, found in sorted(by_rule.items(), key=lambda kv: (-saved_by[kv[0]], kv[0]))
        ]
        lines.append(f"steps saved by rule: {', '.join(each)}")
    return lines
