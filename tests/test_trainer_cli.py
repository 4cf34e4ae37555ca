"""`python -m trainer` as a user runs it: a subprocess, a real MLflow store."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import sweep_env
from mlflow.tracking import MlflowClient


def run_trainer(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = sweep_env(tmp_path)
    command = [sys.executable, "-m", "trainer", f"hydra.run.dir={tmp_path}/run", *overrides]
    return subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_a_run_logs_to_mlflow_and_saves_the_adapter(tmp_path):
    done = run_trainer(tmp_path, "max_steps=2", "batch_size=4", "group_size=2", "task.eval_size=16")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run" / "adapter" / "adapter_config.json").exists()
    assert "group_size: 2" in (tmp_path / "run" / "config.yaml").read_text()

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("grpo")
    # the UI opens on the runs table, not on MLflow 3's (empty) GenAI overview
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["group_size"] == "2"
    assert run.data.params["loss.name"] == "importance_sampling"
    # what trained it, handed in by the trainer (oneDNN: decided as the policy loaded)
    assert run.data.params["backend"] == "ours" and run.data.params["onednn"] == "off"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "reward/mean")] == [1, 2]
    evals = client.get_metric_history(run.info.run_id, "eval/reward/mean")
    assert [m.step for m in evals] == [0, 2]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "adapter"} <= artifacts


def test_a_bad_setting_fails_in_one_line_and_leaves_no_run(tmp_path):
    done = run_trainer(tmp_path, "temperature=0")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        "error: temperature=0.0: must be in (0, 10); 0.6-1.0 is typical"
    )
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("grpo")
    assert experiment is None or not client.search_runs([experiment.experiment_id])


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        (
            "http://127.0.0.1:9",
            "MLFLOW_TRACKING_URI='http://127.0.0.1:9': cannot use this tracking store",
        ),
        ("postgresql://nobody@127.0.0.1:9/mlflow", "cannot use this tracking store"),
    ],
)
def test_an_unreachable_tracking_store_fails_in_one_line(tmp_path, uri, message):
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    done = subprocess.run(
        [sys.executable, "-m", "trainer", f"hydra.run.dir={tmp_path}/run"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert message in done.stderr.strip().splitlines()[-1]
