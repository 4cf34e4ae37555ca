"""Verdicts on real small sweeps: seeds are replicates (one training run each, the
configuration's objective their mean), and configurations that differ only in a setting that
does nothing are called a tie."""

from __future__ import annotations

import statistics
import subprocess
import sys

import pytest
from conftest import run_sweep, study_in, sweep_env
from mlflow.tracking import MlflowClient

from records.sweep import replicates

pytestmark = pytest.mark.slow

SMALL = ["max_steps=2", "batch_size=4", "task.eval_size=32", "eval_every=0"]


def test_seeds_are_replicates_with_their_own_runs_and_a_mean(tmp_path):
    done = run_sweep(
        tmp_path, "lr=1e-3,2e-3", "hydra.sweeper.seeds=3", "hydra.sweeper.health=[]", *SMALL
    )
    assert done.returncode == 0, done.stderr[-3000:]
    trials = study_in(tmp_path).trials
    assert len(trials) == 2 and all(t.state.name == "COMPLETE" for t in trials)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("grpo").experiment_id])
    training = [r for r in runs if r.data.tags.get("sweeper.role") == "trial"]
    assert len(training) == 6
    for t in trials:
        seeds = replicates(t)
        assert [s.seed for s in seeds] == [0, 1, 2]
        assert t.value == pytest.approx(statistics.mean(s.value for s in seeds))
        mine = [r for r in training if r.data.tags["sweeper.trial_number"] == str(t.number)]
        assert sorted(r.data.params["seed"] for r in mine) == ["0", "1", "2"]
        config_run = client.get_run(t.user_attrs["mlflow_run_id"])  # the seeds nest under it
        assert config_run.data.tags["sweeper.role"] == "config"
        assert {r.data.tags["mlflow.parentRunId"] for r in mine} == {config_run.info.run_id}
    table = done.stdout
    assert "seeds  mean" in table and "95% CI" in table
    rows = [line.split() for line in table.splitlines() if line.startswith(("t0 ", "t1 "))]
    assert [row[2] for row in rows] == ["3", "3"], table  # trial, lr, seeds: each over 3 seeds
    report = subprocess.run(
        [sys.executable, "-m", "analysis", "report"],
        cwd=tmp_path,
        env=sweep_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.returncode == 0 and "t over 3 seeds" in report.stdout


def test_a_setting_that_does_nothing_is_called_a_tie(tmp_path):
    # without a KL penalty, kl_discount_factor is never read: the two configurations train
    # the same way, so the verdict must not pick a winner
    done = run_sweep(tmp_path, "kl_discount_factor=0.0,0.5", "hydra.sweeper.health=[]", *SMALL)
    assert done.returncode == 0, done.stderr[-3000:]
    # no winner: tied, or (on an eval that cannot see the change) too few seeds to tell
    assert "Tied at this sample size" in done.stdout or "Too few seeds to tell" in done.stdout
    assert "beat every other" not in done.stdout
    tuned = next((tmp_path / "tuned").glob("*.yaml")).read_text()
    assert "Tied at this sample size" in tuned  # the tuned file records how sure we are
