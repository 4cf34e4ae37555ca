"""`python -m analysis rules --experiment NAME` over runs logged as a plain TRL script logs
them (`report_to="mlflow"`: TRL's metric names, its optimizer steps, its GRPOConfig params),
written through the real MLflow client into a SQLite store: each breaking run is named with
its rule, step and the steps saved; a healthy one is not named."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

EXPERIMENT = "my-trl-runs"
STEPS = 10


def trl_logs(step: int, **changed: float) -> dict[str, float]:
    """One log of TRL's GRPOTrainer, under its names, healthy unless changed."""
    logs = {
        "loss": 0.01,
        "grad_norm": 0.5,
        "learning_rate": 1e-5,
        "reward": 0.2 + 0.01 * step,
        "reward_std": 0.3,
        "rewards/accuracy_reward/mean": 0.2 + 0.01 * step,
        "entropy": 1.5,
        "completions/mean_length": 40.0,
        "completions/clipped_ratio": 0.1,
    }
    return {**logs, **changed}


def log_run(client, experiment_id: str, name: str, logs_by_step, substeps: int = 1) -> str:
    """A run as TRL's MLflowCallback writes it: params, then each log at its global step."""
    run = client.create_run(experiment_id, run_name=name)
    params = {"steps_per_generation": substeps, "gradient_accumulation_steps": 1, "seed": 0}
    now = int(time.time() * 1000)
    metrics = [
        Metric(key, value, now, step * substeps)
        for step, logs in logs_by_step.items()
        for key, value in logs.items()
    ]
    client.log_batch(
        run.info.run_id,
        metrics=metrics,
        params=[Param(k, str(v)) for k, v in params.items()],
    )
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def test_rules_name_each_breaking_trl_run_and_say_nothing_of_a_healthy_one(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    experiment_id = client.create_experiment(EXPERIMENT)
    steps = range(1, STEPS + 1)
    log_run(client, experiment_id, "healthy", {s: trl_logs(s) for s in steps})
    nan_from_4 = {s: trl_logs(s, loss=math.nan if s >= 4 else 0.01) for s in steps}
    log_run(client, experiment_id, "lr-3e-2", nan_from_4)
    # the post-update KL HealthCallback logs beside TRL's metrics, past 10x its bound from 2
    kl = {s: {**trl_logs(s), "kl_pre_post_v2": 5.0 if s >= 2 else 0.01} for s in steps}
    log_run(client, experiment_id, "lr-1e-2", kl)
    # two optimizer steps a generation round: global step 6 is our step 3
    grad_nan = {s: trl_logs(s, grad_norm=math.nan if s >= 3 else 0.5) for s in steps}
    log_run(client, experiment_id, "substeps-2", grad_nan, substeps=2)

    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    done = subprocess.run(
        [sys.executable, "-m", "analysis", "rules", "--experiment", EXPERIMENT],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0] == (
        f"experiment {EXPERIMENT}: the rules would have stopped 3 of 4 runs, saving 19 of 40 "
        f"steps ({19 / 40:.0%})"
    ), lines[0]
    by_run = {line.split(" (")[0].strip(): line for line in lines[1:-1]}
    assert list(by_run) == ["substeps-2", "lr-1e-2", "lr-3e-2"]  # the most steps saved first
    assert (
        "finite_loss at step 4 of 10, 6 steps saved: finite_loss: loss=nan/inf" in by_run["lr-3e-2"]
    )
    assert "post_update_kl at step 4 of 10, 6 steps saved" in by_run["lr-1e-2"]
    assert "finite_grad at step 3 of 10, 7 steps saved" in by_run["substeps-2"]
    assert "healthy" not in done.stdout
    assert lines[-1] == (
        "steps saved by rule: finite_grad 7 (1 run), finite_loss 6 (1 run), post_update_kl 6 (1 run)"
    ), lines[-1]


def test_an_unknown_experiment_or_no_tracking_uri_is_one_line(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    MlflowClient(uri).create_experiment("other")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    for extra, expected in (
        ({}, "error: --experiment: set MLFLOW_TRACKING_URI"),
        ({"MLFLOW_TRACKING_URI": uri}, "error: --experiment='nope': no such MLflow experiment"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "analysis", "rules", "--experiment", "nope"],
            cwd=tmp_path, env={**env, **extra}, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 1
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith(expected), line
    assert Path(tmp_path / "mlflow.db").is_file()
