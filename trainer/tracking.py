"""MLflow logging shared by single runs (`python -m trainer`) and sweep trials.

We log through MlflowClient with explicit run ids rather than MLflow's global active run, so
several runs can be open in one process without mixing (a caller may hold a parent run).
The tracking URI comes from MLFLOW_TRACKING_URI, else MLflow's default (sqlite:///mlflow.db).
"""

from __future__ import annotations

import functools
import os
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import mlflow
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from trainer.locks import flocked
from trainer.validation import ConfigError, first_line

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


def check_tracking_uri(uri: str | None = None) -> str:
    """Fail in one line, before any run starts, when the tracking store cannot be used.

    A server is probed with a 5 s timeout instead of MLflow's own retries (minutes).
    """
    uri = uri or mlflow.get_tracking_uri()
    scheme = urlparse(uri).scheme
    if scheme == "sqlite":  # a local file: check where it goes, without creating it yet
        folder = Path(uri.removeprefix("sqlite:///")).expanduser().absolute().parent
        if not (folder.is_dir() and os.access(folder, os.W_OK)):
            raise ConfigError(f"MLFLOW_TRACKING_URI={uri!r}: cannot write in {str(folder)!r}")
        return uri
    try:
        if scheme in ("http", "https"):
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5).close()
        else:
            MlflowClient(uri).search_experiments(max_results=1)
    except Exception as e:  # any failure here means no run could be logged
        reason = first_line(getattr(e, "reason", None) or e)[:200]
        raise ConfigError(
            f"MLFLOW_TRACKING_URI={uri!r}: cannot use this tracking store ({reason})"
        ) from None
    return uri


@functools.cache
def tracking_client(uri: str | None = None) -> MlflowClient:
    """A client whose store exists: a fresh SQLite store is created by one process at a time.

    MLflow creates and migrates a new SQLite store on first use; two processes doing it at
    once fail ("duplicate column", "Online migration expected to match one row"). Workers of a
    sweep start together, so creation happens under a lock on the database's folder.
    """
    uri = uri or mlflow.get_tracking_uri()
    if urlparse(uri).scheme != "sqlite":
        return MlflowClient(uri)
    with flocked(Path(uri.removeprefix("sqlite:///")).expanduser().absolute().parent):
        client = MlflowClient(uri)  # the store is created here
        client.search_experiments(max_results=1)
    return client


# MLflow 3 opens an experiment of unknown kind on its GenAI overview, which is empty for
# training runs; this kind makes the UI open on the runs table.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


def experiment_id(client: MlflowClient, name: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(name, tags=dict([EXPERIMENT_KIND]))
        except mlflow.exceptions.MlflowException:  # another worker created it first
            experiment = client.get_experiment_by_name(name)
    if EXPERIMENT_KIND[0] not in experiment.tags:
        client.set_experiment_tag(experiment.experiment_id, *EXPERIMENT_KIND)
    return experiment.experiment_id


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

    @classmethod
    def attach(cls, run_id: str, client: MlflowClient | None = None) -> MLflowRun:
        """Continue an existing run (e.g. a resumed training): its curves go on unbroken."""
        run = cls.__new__(cls)
        run.client, run.run_id = client or tracking_client(), run_id
        run.client.update_run(run_id, status="RUNNING")
        return run

    def log_params(self, params: Mapping[str, Any]) -> None:
        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for start in range(0, len(items), 100):  # MLflow accepts at most 100 params a batch
            self.client.log_batch(self.run_id, params=items[start : start + 100])

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        # NaN is a legal metric value in MLflow and worth seeing; inf is stored as a large value.
        now = int(1000 * time.time())
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items() if v is not None]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, str(value))

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def log_artifacts(self, local_dir: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifacts(self.run_id, str(local_dir), artifact_path)

    def log_training_config(self, cfg: DictConfig) -> None:
        """Every resolved hyperparameter as a param, and the whole config as config.yaml."""
        self.log_params(hyperparameters(cfg))
        self.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")

    def end(self, status: str = "FINISHED") -> None:
        """status: FINISHED, FAILED or KILLED (MLflow's names)."""
        self.client.set_terminated(self.run_id, status=status)


class MLflowReporter:
    """The trainer's per-step reporter for a plain run: every step's metrics to MLflow."""

    def __init__(self, run: MLflowRun) -> None:
        self.run = run

    def report(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log_metrics(step, metrics)
