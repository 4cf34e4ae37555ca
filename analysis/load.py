"""Stores -> a tidy per-trial table and per-step metric histories (docs/records.md).

Reads only what a sweep saved: the Optuna storage and the MLflow tracking store. Every
value the report shows has one source here, with a fallback for a study still running or
killed (a trial's `steps_run` and `baseline_reward` are written when it ends, so for a
running trial they come from its MLflow histories instead). Every key comes from
records/sweep.py, the contract the sweep writes by. MLflow being absent or
unreachable is a note, not an error: the Optuna side alone still makes a leaderboard.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from analysis.text import trial_note
from analysis.verdict import named_trial, sweep_verdict
from judge.forecast import FORECAST
from records.database import (
    DatabaseUnreachable,
    absolute_url,
    retried,
    scheme,
    shown_url,
    sqlite_path,
)
from records.defaults import DEFAULT_EXPERIMENT
from records.errors import StoreUnusable, first_line
from records.metrics import (
    ENTROPY,
    EVAL_REWARD,
    GROUPS_ALL_BAD,
    GROUPS_ALL_GOOD,
    GROUPS_MIXED,
    KL_MEANING,
    KL_PRE_POST_V2,
    KL_SAMPLE_TRAIN_V2,
    REWARD,
    stderr_of,
)
from records.optuna_storage import ResilientRDBStorage, optuna_schema
from records.sqlite_schema import made_whole
from records.sweep import (
    FORECAST_HIGH,
    FORECAST_MEAN,
    Replicate,
    Role,
    StudyAttr,
    Tag,
    TrialAttr,
    replicates,
)

DEFAULT_OBJECTIVE = EVAL_REWARD
# KL curves the report draws, most telling first: post-update KL moves with the lr even
# on-policy; sampler-vs-learner KL moves with substeps and stale (async) data.
KL_METRICS = (KL_PRE_POST_V2, KL_SAMPLE_TRAIN_V2)
GROUP_METRICS = (GROUPS_MIXED, GROUPS_ALL_GOOD, GROUPS_ALL_BAD)

History = list[tuple[int, float]]  # (step, value), sorted by step


def watched_metrics(attrs: dict[str, Any]) -> list[str]:
    """The metrics the study's stored health rules read."""
    return [r.get("metric") for r in attrs.get(StudyAttr.HEALTH_RULES) or []]


class AnalysisError(Exception):
    """A problem the user can fix (wrong URL, unknown study): printed as one line."""


@dataclass
class TrialRecord:
    """One trial as the report sees it: Optuna's record plus its MLflow histories."""

    number: int
    state: str  # complete, pruned, failed, running, waiting
    params: dict[str, Any]
    value: float | None  # the objective (complete trials only)
    stderr: float | None  # the objective's standard error (eval noise, first seed)
    last_eval: float | None  # last intermediate objective value (any state)
    steps_run: int | None
    final_kl: float | None
    baseline: float | None
    prune_reason: dict[str, Any] | None
    note: str  # why it was pruned or failed, one line ('' otherwise)
    run_id: str | None
    histories: dict[str, History] = field(default_factory=dict)  # its first seed's run
    replicates: list[Replicate] = field(default_factory=list)  # one per seed that ran
    seed_histories: dict[int, dict[str, History]] = field(default_factory=dict)


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
    _best: list[FrozenTrial | None] | None = field(
        default=None, init=False, repr=False, compare=False
    )  # best(), judged once

    @property
    def objective(self) -> str:
        return self.attrs.get("objective", DEFAULT_OBJECTIVE)

    @property
    def kl_metric(self) -> str:
        """The KL the report plots: the first one a health rule watches."""
        watched = [m for m in watched_metrics(self.attrs) if m in KL_MEANING]
        return next((m for m in (*KL_METRICS, *watched) if m in watched), KL_METRICS[0])

    @property
    def kl_threshold(self) -> float | None:
        return self.attrs.get(StudyAttr.KL_THRESHOLD)

    @property
    def seeds(self) -> int:
        return int(self.attrs.get(StudyAttr.SEEDS, 1))

    @property
    def param_names(self) -> list[str]:
        return list(dict.fromkeys(k for t in self.trials for k in t.params))

    def by_state(self, *states: str) -> list[TrialRecord]:
        return [t for t in self.trials if t.state in states]

    def best(self) -> TrialRecord | None:
        """The trial the study's verdict names best (analysis/verdict.py named_trial), judged
        once: the report's pages and figures each ask for it."""
        if self.study is None:
            return None
        if self._best is None:
            trials = self.study.get_trials(deepcopy=False)
            named = sweep_verdict(trials, self.attrs, self.maximize)
            self._best = [named_trial(trials, named, self.maximize)]
        best = self._best[0]
        return next((t for t in self.trials if best and t.number == best.number), None)

    @property
    def maximize(self) -> bool:
        return self.direction == "maximize"


# --- Optuna ---------------------------------------------------------------------------

SQLITE_READ_TIMEOUT_S = 10  # a reader waits this long for a writer's lock before a retry
DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql")  # stores read through retries


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """The storage, never creating one: a misspelt SQLite path is an error, not a new file."""
    path = sqlite_path(url)
    if path is not None and not path.is_file():
        raise AnalysisError(f"no Optuna storage at {url} ({path.absolute()} does not exist)")
    # A server's dropped connections are replaced; a SQLite file's readers wait out writers.
    kwargs = (
        {"connect_args": {"timeout": SQLITE_READ_TIMEOUT_S}} if path else {"pool_pre_ping": True}
    )
    store = f"the Optuna storage {shown_url(url)}"
    try:
        if path is not None:  # another client may be creating it: waited on, never raced
            made_whole(path, store, optuna_schema(url))
        return retried(
            lambda: ResilientRDBStorage(
                url, skip_table_creation=True, engine_kwargs=kwargs, store=store
            ),
            store,
        )
    except (DatabaseUnreachable, StoreUnusable) as e:
        raise AnalysisError(str(e)) from None
    except Exception as e:  # driver, sqlalchemy and OS errors alike: name the URL
        raise AnalysisError(f"cannot open the Optuna storage {url}: {first_line(e)}") from None


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
        stderr=next((r.stderr for r in replicates(t) if r.stderr is not None), None),
        last_eval=t.intermediate_values[steps[-1]] if steps else None,
        steps_run=attrs.get(TrialAttr.STEPS_RUN),
        final_kl=None,
        baseline=attrs.get(TrialAttr.BASELINE),
        prune_reason=attrs.get(TrialAttr.PRUNE_REASON) if t.state == TrialState.PRUNED else None,
        note=trial_note(t),
        run_id=attrs.get(TrialAttr.MLFLOW_RUN_ID),
        replicates=replicates(t),
    )


def _distributions(trials: list[FrozenTrial]) -> dict[str, Any]:
    """Each param's distribution as its latest trial recorded it (ranges, choice lists)."""
    out: dict[str, Any] = {}
    for t in trials:
        out.update(t.distributions)
    return out


# --- MLflow ---------------------------------------------------------------------------


def history_metrics(data: StudyData) -> list[str]:
    wanted = [REWARD, EVAL_REWARD, stderr_of(EVAL_REWARD), data.objective, *KL_METRICS]
    wanted += [m for m in watched_metrics(data.attrs) if m in KL_MEANING]
    wanted += [ENTROPY, *GROUP_METRICS]
    if data.attrs.get(StudyAttr.PRUNER) == FORECAST:  # drawn on the eval curves
        wanted += [FORECAST_MEAN, FORECAST_HIGH]
    return list(dict.fromkeys(wanted))


def attach_histories(data: StudyData) -> None:
    """Per-step histories of the metrics the report plots, for every seed's training run;
    notes instead of errors."""
    uri = data.attrs.get(StudyAttr.MLFLOW_TRACKING_URI) or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        data.notes.append("No MLflow tracking URI recorded for this study: curves are skipped.")
        return
    try:
        with quick_mlflow():
            client = mlflow_client(uri)
            training_runs = _training_runs(client, data)
            metrics = history_metrics(data)
            for t in data.trials:
                for seed, run_id in sorted(training_runs.get(t.number, {}).items()):
                    t.seed_histories[seed] = {m: history(client, run_id, m) for m in metrics}
                if t.seed_histories:
                    t.histories = next(iter(t.seed_histories.values()))
                    t.run_id = t.run_id or next(iter(training_runs[t.number].values()))
    except Exception as e:  # an unreachable server, a missing file, a deleted run
        data.notes.append(f"MLflow at {uri} could not be read ({first_line(e)}): curves skipped.")
        return
    missing = [t.number for t in data.trials if not t.seed_histories and t.state != "waiting"]
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

    path = sqlite_path(uri)
    if path is not None and not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    from records.tracking_store import ResilientMlflowClient, mlflow_schema

    if scheme(uri) not in DATABASE_SCHEMES:  # a server: MLflow's own retries (quick_mlflow)
        return MlflowClient(uri)
    store = f"the MLflow store {shown_url(uri)}"
    if path is not None:  # another client may be creating it: waited on, never raced
        made_whole(path, store, mlflow_schema(uri))
    return retried(lambda: ResilientMlflowClient(uri), store)


def _training_runs(client: Any, data: StudyData) -> dict[int, dict[int, str]]:
    """trial number -> {seed: training run id}, from the runs' tags."""
    name = data.attrs.get(StudyAttr.MLFLOW_EXPERIMENT, DEFAULT_EXPERIMENT)
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        return {}
    runs = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`{Tag.STUDY}` = '{data.name}' and tags.`{Tag.ROLE}` = '{Role.TRIAL}'",
        max_results=5000,
    )
    found: dict[int, dict[int, str]] = {}
    for run in runs:
        number, seed = run.data.tags.get(Tag.TRIAL_NUMBER, ""), run.data.tags.get(Tag.SEED, "0")
        if number.isdigit():
            found.setdefault(int(number), {}).setdefault(int(seed), run.info.run_id)
    return found


def history(client: Any, run_id: str, metric: str) -> History:
    """A run's metric as [(step, value)] by step (the last value logged at a step)."""
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
