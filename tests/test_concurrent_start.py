"""Workers started at the same instant on fresh default stores (SQLite for Optuna and MLflow)
all come up and share one study: no worker dies creating a store, each point runs once, and
every MLflow run is closed. Each worker waits at a barrier right before it creates a store's
schema, so all three create the tables at the same moment in every round (unforced, the race
hit 3 of 3 rounds on a 2-core host before the fix). One round by default;
GRPO_SWEEPER_RACE_ROUNDS=N repeats it N times (docs/contributing.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import optuna
import pytest
from conftest import RACE_ROUNDS, one_seed_unless_named
from mlflow.tracking import MlflowClient

from records.leases import SCHEMA_BARRIER_ENV
from records.sweep import Role, Tag

pytestmark = pytest.mark.slow

WORKERS = 3
GRID = ["lr=1e-3,2e-3,3e-3", "max_steps=2", "batch_size=4", "task.eval_size=16", "eval_every=0"]


@pytest.mark.parametrize("attempt", range(RACE_ROUNDS))
def test_workers_started_together_on_fresh_stores_all_join_one_study(tmp_path, attempt):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}  # the defaults
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env[SCHEMA_BARRIER_ENV] = f"{barrier}:{WORKERS}"
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "sweeper", "-m", *one_seed_unless_named(GRID)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(WORKERS)
    ]
    outputs = [w.communicate(timeout=600)[0] for w in workers]
    for w, output in zip(workers, outputs, strict=True):
        assert w.returncode == 0, output[-3000:]
        assert "Traceback" not in output, output[-3000:]
    assert len(list(barrier.iterdir())) == 2 * WORKERS  # each worker met both stores' barrier

    storage = f"sqlite:///{tmp_path}/sweeps.db"
    (name,) = optuna.get_all_study_names(storage)
    trials = optuna.load_study(study_name=name, storage=storage).trials
    finished = [t for t in trials if t.state.is_finished()]
    assert Counter(t.params["lr"] for t in finished) == {1e-3: 1, 2e-3: 1, 3e-3: 1}
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("grpo")
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.status for r in runs if r.info.status == "RUNNING"] == []
    assert sum(r.data.tags.get(Tag.ROLE) == Role.STUDY for r in runs) == 1
