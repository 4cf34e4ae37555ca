"""No idle slots: with n_jobs runs at once, a run that is pruned frees its slot for the next
queued trial at once, while the other run is still training (no batch barrier)."""

from __future__ import annotations

import os

import pytest
from conftest import run_sweep, study_in, sweep_env
from mlflow.tracking import MlflowClient

from records.sweep import replicates

pytestmark = pytest.mark.slow

HOLD_AT = 40  # past the collapsing lr's prune, well before max_steps
# Each run marks its start; a run reaching batch HOLD_AT holds there until three runs have
# started. The collapsing lr is pruned before it gets there, so the run training beside it
# is surely still training when the third starts: ordered by state, not by a step count
# long enough on a calm host (400 steps once left 0.3 s to spare on a busy one).
HOLDS_FOR_THE_THIRD = f"""
import os
import time
import uuid
from pathlib import Path

from trainer.env.tasks import AdditionTask


class HoldsForTheThird(AdditionTask):
    def train_problems(self, n, rng):
        marks = Path(os.environ["STARTED_MARKS"])
        self.batches = getattr(self, "batches", 0) + 1
        if self.batches == 1:
            (marks / uuid.uuid4().hex).touch()
        if self.batches == {HOLD_AT}:
            while len(list(marks.iterdir())) < 3:
                time.sleep(0.05)
        return super().train_problems(n, rng)
"""


def test_a_pruned_trial_frees_its_slot_before_its_batch_mate_ends(tmp_path):
    (tmp_path / "holds.py").write_text(HOLDS_FOR_THE_THIRD)
    marks = tmp_path / "started"
    marks.mkdir()
    env = {**sweep_env(tmp_path), "STARTED_MARKS": str(marks)}
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env.get('PYTHONPATH', '')}"
    args = ["hydra/launcher=joblib", "hydra.sweeper.n_jobs=2", "lr=3e-2,1e-3,2e-3"]
    args += [f"max_steps={2 * HOLD_AT}", "batch_size=8", "task.eval_size=16", "eval_every=0"]
    args += ["task._target_=holds.HoldsForTheThird"]
    args += ["hydra.sweeper.devices=[cpu,'cpu:0']"]  # the pool's path, on CPU
    done = run_sweep(tmp_path, *args, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = {t.params["lr"]: t for t in study_in(tmp_path).trials}
    assert trials[3e-2].state.name == "PRUNED"
    assert replicates(trials[3e-2])[0].steps_run < HOLD_AT
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run = {lr: client.get_run(t.user_attrs["mlflow_run_id"]).info for lr, t in trials.items()}
    # t2 (lr=2e-3) started once t0 (lr=3e-2) was pruned, while t1 (lr=1e-3) still trained
    assert run[3e-2].end_time <= run[2e-3].start_time < run[1e-3].end_time
    devices = {lr: replicates(t)[0].device for lr, t in trials.items()}
    assert set(devices.values()) <= {"cpu", "cpu:0"}
    assert devices[3e-2] != devices[1e-3]  # the two that ran together had distinct devices
