"""The terminator (hydra.sweeper.terminator=true) on real TPE sweeps. The swept key,
kl_discount_factor, is never read without a KL penalty, so every configuration trains alike
and nothing more is to gain from the first trials on: the regret bound is ~0, below the eval's
standard error, and the study must stop at terminator_min_trials with its reason."""

from __future__ import annotations

import pytest
from conftest import run_sweep, study_in
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.slow

TINY = ["max_steps=1", "batch_size=4", "group_size=2", "task.eval_size=8", "eval_every=0"]
FLAT = [
    "kl_discount_factor=interval(0,1)",
    "hydra.sweeper.n_trials=6",
    "hydra.sweeper.seed=0",
    "hydra.sweeper.health=[]",
    *TINY,
]


def _complete(study) -> int:
    return sum(t.state.name == "COMPLETE" for t in study.trials)


def test_the_terminator_ends_a_flat_search_early_with_its_reason_and_terminator_false_runs_on(
    tmp_path,
):
    stop = ["hydra.sweeper.terminator=true", "hydra.sweeper.terminator_min_trials=3"]
    done = run_sweep(tmp_path, *FLAT, *stop)
    assert done.returncode == 0, done.stderr[-3000:]
    study = study_in(tmp_path)
    assert _complete(study) == 3  # of n_trials=6
    reason = study.user_attrs["stopped"]
    assert reason.startswith("stopped after 3 completed configurations of 6 planned: the best, t")
    assert "cannot plausibly be beaten by more than its noise (regret bound" in reason
    assert "< its standard error over its eval problems" in reason
    assert done.stderr.strip().splitlines()[-1].endswith(f"; {reason}")  # the final line
    assert f"The search {reason} (hydra.sweeper.terminator=true)." in done.stdout  # verdict
    not_run = [line for line in done.stdout.splitlines() if "WAITING" in line]
    assert len(not_run) == 3  # the table's queued slots say why they never ran
    assert all(line.endswith("not run: the terminator stopped the search") for line in not_run)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    parent = client.get_run(study.user_attrs["mlflow_parent_run_id"])
    assert parent.data.tags["sweeper.stopped"] == reason
    assert f"The search {reason}" in parent.data.tags["sweeper.verdict"]

    again = run_sweep(tmp_path, *FLAT, *stop)  # the same command: the stop holds
    assert again.returncode == 0, again.stderr[-3000:]
    assert _complete(study_in(tmp_path)) == 3

    # Without the setting the same study runs its n_trials, and no longer says it stopped.
    on = run_sweep(tmp_path, *FLAT)
    assert on.returncode == 0, on.stderr[-3000:]
    study = study_in(tmp_path)
    assert _complete(study) == 6
    assert not study.user_attrs["stopped"]
    assert "The search stopped" not in on.stdout
