"""No idle slots: with n_jobs runs at once, a run that is pruned frees its slot for the next
queued trial at once, while the other run is still training (no batch barrier)."""

from __future__ import annotations

import pytest
from conftest import run_sweep, study_in
from mlflow.tracking import MlflowClient

from records.sweep import replicates

pytestmark = pytest.mark.slow


def test_a_pruned_trial_frees_its_slot_before_its_batch_mate_ends(tmp_path):
    args = ["hydra/launcher=joblib", "hydra.sweeper.n_jobs=2", "lr=3e-2,1e-3,2e-3"]
    # Long enough that the batch-mate still trains when the next trial starts: 120 steps (~2 s
    # of training at 60 steps/s) once ended 0.3 s before it on a busy host; 400 leave ~6 s.
    args += ["max_steps=400", "batch_size=8", "task.eval_size=16", "eval_every=0"]
    args += ["hydra.sweeper.devices=[cpu,'cpu:0']"]  # the pool's path, on CPU
    done = run_sweep(tmp_path, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = {t.params["lr"]: t for t in study_in(tmp_path).trials}
    assert trials[3e-2].state.name == "PRUNED"
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run = {lr: client.get_run(t.user_attrs["mlflow_run_id"]).info for lr, t in trials.items()}
    # t2 (lr=2e-3) started once t0 (lr=3e-2) was pruned, while t1 (lr=1e-3) still trained
    assert run[3e-2].end_time <= run[2e-3].start_time < run[1e-3].end_time
    devices = {lr: replicates(t)[0].device for lr, t in trials.items()}
    assert set(devices.values()) <= {"cpu", "cpu:0"}
    assert devices[3e-2] != devices[1e-3]  # the two that ran together had distinct devices
