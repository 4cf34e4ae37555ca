"""What a shared sweep left in its two stores, point by point, and how it compares with a sweep
of the same grid that met no fault: the chaos benchmark (bench/bench_chaos.py) and the
hosts-apart test (tests/test_hosts_apart.py) check a run with these.

A point's record is its final trial (COMPLETE or PRUNED: the trial not interrupted), its value,
and its training run's curves: every metric at every step, read back from MLflow. Timings and
throughput are left out of the curves: they are the host's, not the training's.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import optuna
import psycopg
from mlflow.tracking import MlflowClient

from records.sweep import Role, Tag, is_interrupted, replicates

NOT_TRAINING = ("time/", "throughput/")  # metric prefixes a host's speed sets


def trials_of(storage: str) -> list[optuna.trial.FrozenTrial]:
    """The study's trials; none before a worker has created it."""
    names = optuna.get_all_study_names(storage)
    if not names:
        return []
    (name,) = names
    return optuna.load_study(study_name=name, storage=storage).trials


def trial_runs(tracking: str) -> list:
    client = MlflowClient(tracking)
    runs = client.search_runs([client.get_experiment_by_name("grpo").experiment_id])
    return [r for r in runs if r.data.tags.get(Tag.ROLE) == Role.TRIAL]


def point(trial: optuna.trial.FrozenTrial) -> str:
    """A point's name: its params, sorted (a grid slot keeps them in fixed_params)."""
    params = trial.system_attrs.get("fixed_params") or trial.params
    return " ".join(f"{k}={params[k]}" for k in sorted(params))


def ended_once(trials: list, tracking: str, points: int) -> list[str]:
    """What breaks "every point ended exactly once": a point ended twice or never, a trial
    left RUNNING or charged a failure, an MLflow training run left RUNNING or two finished runs
    for one point. [] when it holds."""
    problems = []
    ended = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    problems += [f"ended {n} times: {p}" for p, n in Counter(map(point, ended)).items() if n > 1]
    if len({point(t) for t in ended}) != points:
        problems.append(f"{len({point(t) for t in ended})} of {points} points ended")
    left = [
        t for t in trials if t.state.name not in ("COMPLETE", "PRUNED") and not is_interrupted(t)
    ]
    problems += [f"t{t.number} {t.state.name}: {t.user_attrs.get('fail_reason', '')}" for t in left]
    runs = trial_runs(tracking)
    problems += [
        f"MLflow run RUNNING: {r.info.run_name}" for r in runs if r.info.status == "RUNNING"
    ]
    finished = Counter(
        r.data.tags.get(Tag.TRIAL_NUMBER) for r in runs if r.info.status == "FINISHED"
    )
    problems += [f"{n} finished runs for trial {k}" for k, n in finished.items() if n > 1]
    return problems


def metric_steps_logged_twice(tracking: str) -> list[str]:
    client = MlflowClient(tracking)
    twice = []
    for run in trial_runs(tracking):
        for key in run.data.metrics:
            steps = Counter(m.step for m in client.get_metric_history(run.info.run_id, key))
            twice += [f"{run.info.run_name} {key} step {s}" for s, n in steps.items() if n > 1]
    return twice


def records(trials: list, tracking: str) -> dict[str, dict[str, Any]]:
    """{point: {state, value, curves: {metric: {step: value}}}} of every point that ended."""
    client = MlflowClient(tracking)
    out = {}
    for trial in trials:
        if trial.state.name not in ("COMPLETE", "PRUNED"):
            continue
        (seed,) = replicates(trial)
        run = client.get_run(seed.run_id)
        curves = {
            key: {m.step: m.value for m in client.get_metric_history(seed.run_id, key)}
            for key in run.data.metrics
            if not key.startswith(NOT_TRAINING)
        }
        out[point(trial)] = {
            "state": trial.state.name,
            "value": trial.value,
            "steps_run": seed.steps_run,
            "resumed_from_step": seed.resumed_from_step,
            "curves": curves,
        }
    return out


def compared(reference: dict, chaotic: dict, tolerance: float = 0.0) -> dict[str, Any]:
    """Every point of the chaotic run against the fault-free reference: the same end (state,
    final value) and, metric by metric, the same steps with values within `tolerance`
    (absolute; 0: bit-identical). Lists each difference."""
    differences = []
    worst = 0.0
    for name in sorted(set(reference) | set(chaotic)):
        ref, got = reference.get(name), chaotic.get(name)
        if ref is None or got is None:
            differences.append(
                f"{name}: only in the {'chaotic' if ref is None else 'reference'} run"
            )
            continue
        if (ref["state"], ref["steps_run"]) != (got["state"], got["steps_run"]):
            differences.append(
                f"{name}: ended {got['state']} after {got['steps_run']} steps, "
                f"the reference {ref['state']} after {ref['steps_run']}"
            )
        pairs = [("value", ref["value"], got["value"])]
        if set(ref["curves"]) != set(got["curves"]):
            differences.append(
                f"{name}: metrics differ: {sorted(set(ref['curves']) ^ set(got['curves']))}"
            )
        for key in sorted(set(ref["curves"]) & set(got["curves"])):
            a, b = ref["curves"][key], got["curves"][key]
            if set(a) != set(b):
                differences.append(f"{name} {key}: steps {sorted(set(a) ^ set(b))} in one run only")
            pairs += [(f"{key} step {s}", a[s], b[s]) for s in sorted(set(a) & set(b))]
        for what, x, y in pairs:
            gap = _gap(x, y)
            worst = max(worst, gap)
            if gap > tolerance:
                differences.append(f"{name} {what}: {y!r}, the reference {x!r}")
    resumed = sum(r["resumed_from_step"] is not None for r in chaotic.values())
    return {
        "points": len(reference),
        "resumed_points": resumed,
        "tolerance": tolerance,
        "largest_difference": worst,
        "differences": differences[:50],
        "differences_in_all": len(differences),
    }


def _gap(x: float | None, y: float | None) -> float:
    if x is None or y is None:
        return 0.0 if x is y else math.inf
    if math.isnan(x) and math.isnan(y):
        return 0.0
    return abs(x - y)


def clock_ahead(storage: str, trials: list) -> dict[int, float]:
    """Seconds each ended (completed or pruned) trial's worker clock ran ahead of the
    database's: its end on the worker's clock (Optuna's datetime_complete) less its last
    heartbeat on the server's (PostgreSQL only)."""
    with psycopg.connect(storage) as c:
        beats = dict(c.execute("SELECT trial_id, heartbeat FROM trial_heartbeats").fetchall())
    return {
        t.number: round((t.datetime_complete - beats[t._trial_id]).total_seconds(), 1)
        for t in trials
        if t.state.name in ("COMPLETE", "PRUNED") and t._trial_id in beats
    }
