"""Stores -> a tidy per-trial table and per-step metric histories (docs/records.md).

Reads only what a sweep saved: the Optuna storage and the MLflow tracking store. Every
value the report shows has one source here, with a fallback for a study still running or
killed (a trial's `steps_run`, `final_kl` and `baseline_reward` are written when it ends,
so for a running trial they come from its MLflow histories instead). MLflow being absent or
unreachable is a note, not an error: the Optuna side alone still makes a leaderboard.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
from optuna.trial import FrozenTrial, TrialState

DEFAULT_STORAGE = "sqlite:///sweeps.db"  # the sweeper's default (hydra.sweeper.storage)
DEFAULT_OBJECTIVE = "eval/reward/mean"
DEFAULT_KL_METRIC = "kl_sample_train_v2"
REWARD = "reward/mean"
EVAL_REWARD = "eval/reward/mean"
GROUP_METRICS = ("groups/frac_mixed", "groups/frac_all_good", "groups/frac_all_bad")

History = list[tuple[int, float]]  # (step, value), sorted by step


class AnalysisError(Exception):
    """A problem the user can fix (wrong URL, unknown study): printed as one line."""


@dataclass
class TrialRecord:
    """One trial as the report sees it: Optuna's record plus its MLflow histories."""

    number: int
    state: str  # complete, pruned, failed, running, waiting
    params: dict[str, Any]
    value: float | None  # the objective (complete trials only)
    last_eval: float | None  # last intermediate objective value (any state)
    steps_run: int | None
    final_kl: float | None
    baseline: float | None
    prune_reason: dict[str, Any] | None
    note: str  # why it was pruned or failed, one line ('' otherwise)
    run_id: str | None
    histories: dict[str, History] = field(default_factory=dict)


@dataclass
class StudyData:
    """Everything the report needs about one study."""

    name: str
    storage: str
    attrs: dict[str, Any]
    direction: str  # maximize or minimize
    trials: list[TrialRecord]
    distributions: dict[str, optuna.distributions.BaseDistribution]
    notes: list[str] = field(default_factory=list)  # missing data, said once
    study: optuna.Study | None = None

    @property
    def objective(self) -> str:
        return self.attrs.get("objective", DEFAULT_OBJECTIVE)

    @property
    def kl_metric(self) -> str:
        return self.attrs.get("kl_metric", DEFAULT_KL_METRIC)

    @property
    def kl_threshold(self) -> float | None:
        return self.attrs.get("kl_threshold")

    @property
    def param_names(self) -> list[str]:
        return list(dict.fromkeys(k for t in self.trials for k in t.params))

    def by_state(self, *states: str) -> list[TrialRecord]:
        return [t for t in self.trials if t.state in states]

    def best(self) -> TrialRecord | None:
        done = [t for t in self.by_state("complete") if _finite(t.value)]
        if not done:
            return None
        pick = max if self.direction == "maximize" else min
        return pick(done, key=lambda t: t.value)


# --- Optuna ---------------------------------------------------------------------------


def absolute_url(url: str) -> str:
    """`sqlite:///sweeps.db` -> `sqlite:////abs/path/sweeps.db`, as the sweeper records it."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and url != "sqlite:///:memory:":
        return prefix + str(Path(url[len(prefix) :]).expanduser().absolute())
    return url


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """The storage, never creating one: a misspelt SQLite path is an error, not a new file."""
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        path = Path(url[len("sqlite:///") :])
        if not path.is_file():
            raise AnalysisError(f"no Optuna storage at {url} ({path.absolute()} does not exist)")
    try:
        return optuna.storages.RDBStorage(url, skip_table_creation=True)
    except Exception as e:  # driver, sqlalchemy and OS errors alike: name the URL
        raise AnalysisError(f"cannot open the Optuna storage {url}: {_first_line(e)}") from None


def pick_study(storage: optuna.storages.BaseStorage, name: str | None) -> str:
    """The named study, or the only / most recently created one in the storage."""
    names = optuna.get_all_study_names(storage=storage)
    if name is not None:
        if name not in names:
            known = ", ".join(names) or "none"
            raise AnalysisError(f"no study {name!r} in the storage (studies: {known})")
        return name
    if not names:
        raise AnalysisError("the storage holds no study yet; run a sweep first")
    return max(names, key=storage.get_study_id_from_name)  # ids grow: the newest study


def load_study(storage_url: str, name: str | None = None, with_mlflow: bool = True) -> StudyData:
    """The study's trials as records, with MLflow histories when the store is reachable."""
    storage_url = absolute_url(storage_url)
    storage = open_storage(storage_url)
    name = pick_study(storage, name)
    study = optuna.load_study(study_name=name, storage=storage)
    trials = study.get_trials(deepcopy=False)
    data = StudyData(
        name=name,
        storage=storage_url,
        attrs=dict(study.user_attrs),
        direction=study.direction.name.lower(),
        trials=[_record(t) for t in sorted(trials, key=lambda t: t.number)],
        distributions=_distributions(trials),
        study=study,
    )
    if with_mlflow:
        attach_histories(data)
    fill_from_histories(data)
    return data


STATE_NAMES = {
    TrialState.COMPLETE: "complete",
    TrialState.PRUNED: "pruned",
    TrialState.FAIL: "failed",
    TrialState.RUNNING: "running",
    TrialState.WAITING: "waiting",
}


def _record(t: FrozenTrial) -> TrialRecord:
    attrs = t.user_attrs
    steps = sorted(t.intermediate_values)
    return TrialRecord(
        number=t.number,
        state=STATE_NAMES[t.state],
        params=dict(t.params),
        value=t.value if t.state == TrialState.COMPLETE else None,
        last_eval=t.intermediate_values[steps[-1]] if steps else None,
        steps_run=attrs.get("steps_run"),
        final_kl=attrs.get("final_kl"),
        baseline=attrs.get("baseline_reward"),
        prune_reason=attrs.get("prune_reason") if t.state == TrialState.PRUNED else None,
        note=_note(t),
        run_id=attrs.get("mlflow_run_id"),
    )


def _note(t: FrozenTrial) -> str:
    attrs = t.user_attrs
    reason = attrs.get("prune_reason")
    if t.state == TrialState.PRUNED and isinstance(reason, dict):
        return prune_text(reason)
    if t.state == TrialState.PRUNED:
        return "pruned by the objective pruner"
    if t.state == TrialState.FAIL:
        return str(attrs.get("fail_reason", "failed (no reason recorded)"))
    if t.state == TrialState.WAITING and "retry_of" in attrs:
        return f"queued again (retry of t{attrs['retry_of']})"
    return ""


def prune_text(reason: dict[str, Any]) -> str:
    """`kl_sample_train_v2=0.034 > 0.01 at step 7`, as the sweeper tags the MLflow run."""
    metric, value, step = reason.get("metric"), reason.get("value"), reason.get("step")
    threshold = reason.get("threshold")
    shown = f"{value:.3g}" if isinstance(value, int | float) else str(value)
    if threshold is None:
        return f"{metric}={shown} below the pruner's bar at step {step}"
    return f"{metric}={shown} > {threshold:g} at step {step}"


def _distributions(trials: list[FrozenTrial]) -> dict[str, Any]:
    """Each param's distribution as its latest trial recorded it (ranges, choice lists)."""
    out: dict[str, Any] = {}
    for t in trials:
        out.update(t.distributions)
    return out


# --- MLflow ---------------------------------------------------------------------------


def history_metrics(data: StudyData) -> list[str]:
    return list(
        dict.fromkeys([REWARD, EVAL_REWARD, data.objective, data.kl_metric, *GROUP_METRICS])
    )


def attach_histories(data: StudyData) -> None:
    """Per-step histories of the metrics the report plots; notes instead of errors."""
    uri = data.attrs.get("mlflow_tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        data.notes.append("No MLflow tracking URI recorded for this study: curves are skipped.")
        return
    try:
        with quick_mlflow():
            client = mlflow_client(uri)
            run_ids = _child_runs(client, data)
            for t in data.trials:
                t.run_id = t.run_id or run_ids.get(t.number)
                if t.run_id:
                    metrics = history_metrics(data)
                    t.histories = {m: _history(client, t.run_id, m) for m in metrics}
    except Exception as e:  # an unreachable server, a missing file, a deleted run
        data.notes.append(f"MLflow at {uri} could not be read ({_first_line(e)}): curves skipped.")
        return
    missing = [t.number for t in data.trials if not t.run_id and t.state != "waiting"]
    if missing:
        shown = ", ".join(f"t{n}" for n in missing)
        data.notes.append(f"No MLflow run found for {shown}: their curves are missing.")


@contextlib.contextmanager
def quick_mlflow() -> Iterator[None]:
    """MLflow HTTP calls fail in seconds inside this block, not after minutes of retries.

    MLflow retries an unreachable server 7 times with backoff; a report with MLflow down
    should just say so. The user's own MLFLOW_HTTP_* settings win; the old environment is
    restored afterwards.
    """
    saved = dict(os.environ)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    try:
        yield
    finally:
        for key in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
            if key not in saved:
                os.environ.pop(key, None)


def mlflow_client(uri: str) -> Any:
    """A client for the recorded store; a missing SQLite file is an error, never created."""
    from mlflow.tracking import MlflowClient

    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        raise FileNotFoundError(f"{uri[len('sqlite:///') :]} does not exist")
    return MlflowClient(uri)


def _child_runs(client: Any, data: StudyData) -> dict[int, str]:
    """trial number -> child run id, for trials whose Optuna record lacks the run id."""
    experiment = client.get_experiment_by_name(data.attrs.get("mlflow_experiment", "grpo"))
    if experiment is None:
        return {}
    runs = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`sweeper.study` = '{data.name}' and tags.`sweeper.role` = 'trial'",
        max_results=5000,
    )
    found: dict[int, str] = {}
    for run in runs:
        number = run.data.tags.get("sweeper.trial_number", "")
        if number.isdigit():
            found.setdefault(int(number), run.info.run_id)
    return found


def _history(client: Any, run_id: str, metric: str) -> History:
    points = {m.step: m.value for m in client.get_metric_history(run_id, metric)}
    return sorted(points.items())


def fill_from_histories(data: StudyData) -> None:
    """Running or killed trials: steps run, final KL and baseline from their histories."""
    for t in data.trials:
        h = t.histories
        if t.steps_run is None:
            steps = [s for values in h.values() for s, _ in values]
            t.steps_run = max(steps) if steps else None
        kl = h.get(data.kl_metric)
        if t.final_kl is None and kl:
            t.final_kl = kl[-1][1]
        evals = dict(h.get(EVAL_REWARD, []))
        if t.baseline is None and 0 in evals:
            t.baseline = evals[0]
        obj = h.get(data.objective)
        if t.last_eval is None and obj:
            t.last_eval = obj[-1][1]


# --- the tidy table -------------------------------------------------------------------


def trials_frame(data: StudyData) -> pd.DataFrame:
    """One row per trial: number, params, objective, state, steps, final KL, note."""
    rows = []
    for t in data.trials:
        row: dict[str, Any] = {"trial": t.number}
        row.update({p: t.params.get(p) for p in data.param_names})
        row.update(
            objective=t.value,
            state=t.state,
            steps_run=t.steps_run,
            final_kl=t.final_kl,
            baseline=t.baseline,
            last_eval=t.last_eval,
            note=t.note,
            mlflow_run_id=t.run_id,
        )
        rows.append(row)
    return pd.DataFrame(rows)


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
