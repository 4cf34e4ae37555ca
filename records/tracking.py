"""MLflow logging shared by single runs (`python -m trainer`) and sweep trials.

Every MLflow write of the project is made here: the trainer, the sweeper and the analysis
write through MLflowRun (a run's params, metrics, tags, artifacts and status) and
tag_experiment, never through a client's own write methods (tests/test_mlflow_writes.py
checks it), so each write goes through the retrying client of tracking_client
(records/tracking_store.py, which also checks and creates the store).

We log through MlflowClient with explicit run ids rather than MLflow's global active run, so
several runs can be open in one process without mixing (a caller may hold a parent run).
The tracking URI comes from MLFLOW_TRACKING_URI, else MLflow's default (sqlite:///mlflow.db).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import mlflow
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from records.database import retried
from records.tracking_store import ResilientMlflowClient, tracking_client

# Keys that describe where a run lives, not what it trains: never params, never tuned values.
BOOKKEEPING_KEYS = ("output_dir", "resume", "experiment")


def hyperparameters(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config flattened to dotted keys, bookkeeping left out."""
    container = OmegaConf.to_container(cfg, resolve=True)
    flat: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = node

    walk({k: v for k, v in container.items() if k not in BOOKKEEPING_KEYS}, "")
    return flat


# What the experiment holds, for MLflow's own bookkeeping. MLflow 3.17's UI still opens every
# experiment on its GenAI overview whatever this says; the runs view is reached by the link the
# sweep prints (analysis/mlflow_ui.py).
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


def experiment_id(client: MlflowClient, name: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(name, tags=dict([EXPERIMENT_KIND]))
        except mlflow.exceptions.MlflowException:  # another worker created it first
            experiment = client.get_experiment_by_name(name)
    if EXPERIMENT_KIND[0] not in experiment.tags:
        tag_experiment(client, experiment.experiment_id, *EXPERIMENT_KIND)
    return experiment.experiment_id


# MLflow 3.17's UI opens its GenAI pages unless a link says otherwise (analysis/mlflow_ui.py).
TRAINING_PAGES = ("workflowType", "machine_learning")
MLFLOW_UI_DEFAULT = "http://127.0.0.1:5000"  # where `mlflow ui` listens unless told otherwise


def is_server(tracking_uri: str) -> bool:
    return urlparse(tracking_uri).scheme in ("http", "https")


def ui_base(tracking_uri: str) -> str:
    """Where the UI of a store is: a tracking server's own address, else where `mlflow ui`
    serves by default."""
    return tracking_uri.rstrip("/") if is_server(tracking_uri) else MLFLOW_UI_DEFAULT


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """One run's page on the model-training pages (its bare address opens the GenAI ones,
    charts never loading)."""
    experiment, run = quote(str(experiment_id), safe=""), quote(run_id, safe="")
    page = "=".join(TRAINING_PAGES)
    return f"{ui_base(tracking_uri)}/#/experiments/{experiment}/runs/{run}?{page}"


def tag_experiment(client: MlflowClient, experiment_id: str, key: str, value: str) -> None:
    """Set (or replace) one tag of an experiment, e.g. a saved view (analysis/mlflow_ui.py)."""
    client.set_experiment_tag(experiment_id, key, value)


class MLflowRun:
    """One MLflow run: params, per-step metrics, artifacts, and how it ended."""

    def __init__(
        self,
        experiment: str,
        run_name: str,
        parent_run_id: str | None = None,
        tags: Mapping[str, str] | None = None,
        client: MlflowClient | None = None,
    ) -> None:
        self.client = client or tracking_client()
        all_tags = dict(tags or {})
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(
            experiment_id(self.client, experiment), run_name=run_name, tags=all_tags
        )
        self.run_id = run.info.run_id
        self.logged_through = -1  # the last step with metrics in the run
        self.still_ours: Callable[[], None] | None = None  # raises once the run's job is lost

    @classmethod
    def existing(cls, run_id: str, client: MlflowClient | None = None) -> MLflowRun:
        """An existing run, to write to as it is (a tag, a closing metric, its ending)."""
        run = cls.__new__(cls)
        run.client, run.run_id = client or tracking_client(), run_id
        run.logged_through = -1
        run.still_ours = None
        return run

    @classmethod
    def attach(cls, run_id: str, client: MlflowClient | None = None) -> MLflowRun:
        """Continue an existing run (e.g. a resumed training): its curves go on unbroken."""
        run = cls.existing(run_id, client)
        run.reopen()
        run.logged_through = last_step(run.client, run_id)
        return run

    def log_decided(self, params: Mapping[str, Any]) -> None:
        """Params the run decided on its host (oneDNN, threads): a resumed run keeps what its
        first leg recorded (MLflow refuses a param's new value), its log says what it used."""
        recorded = self.client.get_run(self.run_id).data.params
        self.log_params({k: v for k, v in params.items() if k not in recorded})

    def url(self, tracking_uri: str) -> str:
        """This run's page in the MLflow UI (run_url)."""
        experiment = self.client.get_run(self.run_id).info.experiment_id
        return run_url(tracking_uri, experiment, self.run_id)

    def log_params(self, params: Mapping[str, Any]) -> None:
        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for start in range(0, len(items), 100):  # MLflow accepts at most 100 params a batch
            self.client.log_batch(self.run_id, params=items[start : start + 100])

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        # A resumed run trains again the steps after its checkpoint: those the interrupted
        # copy logged keep their values, so every step is in the curve once.
        if step <= self.logged_through:
            return
        # NaN is a legal metric value in MLflow and worth seeing; inf is stored as a large value.
        now = int(1000 * time.time())
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items() if v is not None]
        if not batch:
            return
        if not isinstance(self.client, ResilientMlflowClient):
            self.client.log_batch(self.run_id, metrics=batch)
            return

        # Retried while the database is unreachable, but never sent again blindly: a lost
        # reply may hide a commit (the step is stored), and a cut long enough for another
        # worker to take the job over (still_ours raises) means its copy logs this step.
        def applied() -> tuple[bool, None]:
            if self.still_ours is not None:
                self.still_ours()
            stored = self.client.get_metric_history(self.run_id, batch[0].key)
            return any(m.step == step for m in stored), None

        retried(
            lambda: MlflowClient.log_batch(self.client, self.run_id, metrics=batch),
            self.client.store,
            applied=applied,
        )

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, str(value))

    def remove_tag(self, key: str) -> None:
        self.client.delete_tag(self.run_id, key)

    def save_text(self, text: str, artifact_file: str) -> None:
        """`text` as the run's artifact `artifact_file` (e.g. config.yaml)."""
        self.client.log_text(self.run_id, text, artifact_file)

    def save_artifacts(self, local_dir: str | Path, artifact_path: str | None = None) -> None:
        """The files of `local_dir` as the run's artifacts, under `artifact_path`."""
        self.client.log_artifacts(self.run_id, str(local_dir), artifact_path)

    def log_training_config(self, cfg: DictConfig, facts: Mapping[str, Any]) -> None:
        """Every resolved hyperparameter as a param, the facts the trainer hands in (which
        backend trains it: trainer/backends/run_params.py) beside them, and the whole config
        as config.yaml."""
        self.log_params({**hyperparameters(cfg), **facts})
        self.save_text(OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")

    @property
    def status(self) -> str:
        """RUNNING, FINISHED, FAILED or KILLED (MLflow's names), as the store has it now."""
        return self.client.get_run(self.run_id).info.status

    def reopen(self) -> None:
        """Mark the run RUNNING again (a resumed training, a resumed sweep's parent run)."""
        self.client.update_run(self.run_id, status="RUNNING")

    def end(self, status: str = "FINISHED") -> None:
        """status: FINISHED, FAILED or KILLED (MLflow's names)."""
        self.client.set_terminated(self.run_id, status=status)

    def delete(self) -> None:
        self.client.delete_run(self.run_id)


def last_step(client: MlflowClient, run_id: str) -> int:
    """The last step any metric of the run was logged at (-1: none)."""
    keys = client.get_run(run_id).data.metrics
    steps = [m.step for key in keys for m in client.get_metric_history(run_id, key)]
    return max(steps, default=-1)


class MLflowReporter:
    """The trainer's per-step reporter for a plain run: every step's metrics to MLflow."""

    def __init__(self, run: MLflowRun) -> None:
        self.run = run

    def report(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log_metrics(step, metrics)

    def params(self, params: Mapping[str, Any]) -> None:
        self.run.log_decided(params)


def write_active_run(
    metrics: Mapping[str, float] | None = None,
    tags: Mapping[str, str] | None = None,
    step: int = 0,
) -> None:
    """Metrics and tags onto this process's active fluent run, one a user's own script opened
    (TRL's `report_to="mlflow"`): what the health callback records there."""
    import mlflow

    if metrics:
        mlflow.log_metrics(dict(metrics), step=step)
    for key, value in (tags or {}).items():
        mlflow.set_tag(key, value)


def log_model_under(uri: str, run_id: str, tag: str, flavor_log_model, **kwargs: Any) -> str:
    """Log a model (a flavor's `log_model`, given kwargs) under an existing, maybe ended, run;
    tag the run with the model's URI and restore its status. Returns the model's URI."""
    import mlflow

    client = tracking_client(uri)
    status = client.get_run(run_id).info.status
    mlflow.set_tracking_uri(uri)
    with mlflow.start_run(run_id=run_id):  # reopened, then its status restored
        info = flavor_log_model(**kwargs)
        mlflow.set_tag(tag, info.model_uri)
    client.set_terminated(run_id, status)
    return info.model_uri
