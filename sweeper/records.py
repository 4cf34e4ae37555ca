"""What a sweep writes to MLflow and Optuna beyond the per-step metrics (docs/records.md).

Shared by the sweeper process (parent run, stale trials, summary) and the job (child run
name and tags), so both sides spell every key the same way.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlflow
import optuna
from mlflow.tracking import MlflowClient
from optuna.trial import FrozenTrial, TrialState

from sweeper.pruning import PruneReason
from sweeper.space import show
from trainer.tracking import MLflowRun


def tracking_uri() -> str:
    """MLflow's tracking URI with any SQLite path made absolute, for jobs in other dirs."""
    uri = mlflow.get_tracking_uri()
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str(Path(uri[len(prefix) :]).absolute())
    return uri


def trial_run_name(number: int, params: Mapping[str, Any]) -> str:
    """`t3 group_size=8 lr=2e-05`: readable in the MLflow UI's run list."""
    return f"t{number} {show(params)}".rstrip()


def start_parent_run(experiment: str, study: str, params: Mapping[str, Any]) -> str:
    run = MLflowRun(
        experiment,
        run_name=study,
        tags={"sweeper.role": "study", "sweeper.study": study},
        client=MlflowClient(tracking_uri()),
    )
    run.log_params(params)
    return run.run_id


def reopen_run(run_id: str) -> None:
    """A resumed sweep marks its parent run RUNNING again until it ends."""
    MlflowClient(tracking_uri()).update_run(run_id, status="RUNNING")


def delete_run(run_id: str) -> None:
    MlflowClient(tracking_uri()).delete_run(run_id)


def end_trial_run(run_id: str | None, status: str, reason: str) -> None:
    """Close a failed trial's child run on the job's behalf (its process died, Ctrl-C).

    status: FAILED, or KILLED for Ctrl-C. A run the job already closed keeps its status.
    """
    if not run_id:
        return
    client = MlflowClient(tracking_uri())
    client.set_tag(run_id, "sweeper.state", "FAIL")
    client.set_tag(run_id, "sweeper.fail_reason", reason)
    if client.get_run(run_id).info.status == "RUNNING":
        client.set_terminated(run_id, status=status)


def finish_parent_run(run_id: str, study: optuna.Study, status: str) -> None:
    """Best trial, trials.csv and the final status on the study's parent run."""
    client = MlflowClient(tracking_uri())
    best = best_trial(study)
    if best is not None:
        client.log_metric(run_id, "best_value", best.value)
        client.log_metric(run_id, "best_trial", best.number)
        client.set_tag(run_id, "sweeper.best_params", json.dumps(best.params))
    client.log_text(run_id, trials_csv(study), "trials.csv")
    client.set_terminated(run_id, status=status)


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The best COMPLETE trial, or None (Optuna's `best_trial` raises instead)."""
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    done = [t for t in done if t.value is not None and math.isfinite(t.value)]
    if not done:
        return None
    pick = max if study.direction == optuna.study.StudyDirection.MAXIMIZE else min
    return pick(done, key=lambda t: t.value)


def trial_note(trial: FrozenTrial) -> str:
    """The one-line why of a pruned or failed trial ('' otherwise)."""
    attrs = trial.user_attrs
    if trial.state == TrialState.PRUNED and "prune_reason" in attrs:
        return str(PruneReason(**attrs["prune_reason"]))
    return str(attrs.get("fail_reason", ""))


def trials_csv(study: optuna.Study) -> str:
    trials = study.get_trials(deepcopy=False)
    names = sorted({k for t in trials for k in t.params})
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["number", "state", "value", *names, "steps_run", "note", "mlflow_run_id"])
    for t in trials:
        params = [t.params.get(n, "") for n in names]
        attrs = t.user_attrs
        row = [t.number, t.state.name, t.value, *params, attrs.get("steps_run", "")]
        writer.writerow([*row, trial_note(t), attrs.get("mlflow_run_id", "")])
    return out.getvalue()
