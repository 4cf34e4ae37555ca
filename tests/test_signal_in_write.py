"""SIGTERM that lands inside a store write (a preempted job mid-commit): the write finishes or
rolls back before the interrupt is handled, so the handler's own writes never wait on a lock
this process still holds. Real MLflow, real SQLite: a hook (tests/write_hook) holds one
metric write open, its transaction and SQLite's write lock with it, while the signal lands."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ONE_SEED, run_sweep, study_in, sweep_env
from mlflow.tracking import MlflowClient

from records.sweep import TrialAttr

pytestmark = pytest.mark.slow

HOOK_DIR = Path(__file__).parent / "write_hook"
HOLD_WRITE_ENV = "GRPO_SWEEPER_TEST_HOLD_WRITE"  # as tests/write_hook/sitecustomize.py reads it
HOLD_S = 3  # a slow write: longer than a commit takes, shorter than the exit bound
ARGS = ["lr=1e-3", "batch_size=4", "max_steps=20", "eval_every=0", "task.eval_size=16"]
ARGS += ["save_every=3", "hydra.sweeper.heartbeat_interval=1", "hydra.sweeper.grace_period=3"]
ARGS += ["hydra.sweeper.health=[]", ONE_SEED]


def _start_holding_a_write(cwd: Path, marker: Path, nth: int) -> subprocess.Popen:
    env = sweep_env(cwd)
    env["PYTHONPATH"] = os.pathsep.join([str(HOOK_DIR), env.get("PYTHONPATH", "")])
    env[HOLD_WRITE_ENV] = f"{marker}:{nth}:{HOLD_S}"
    command = [sys.executable, "-m", "sweeper", "-m", *ARGS]
    return subprocess.Popen(
        command, cwd=cwd, env=env, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def _wait_for(marker: Path, sweep: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if sweep.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no write was held: {sweep.communicate()[1][-3000:]}")
        time.sleep(0.05)


def test_sigterm_inside_an_mlflow_write_exits_at_once_with_nothing_running(tmp_path):
    marker = tmp_path / "holding"
    sweep = _start_holding_a_write(tmp_path, marker, nth=6)
    try:
        _wait_for(marker, sweep)
        signalled = time.monotonic()
        sweep.send_signal(signal.SIGTERM)
        _, stderr = sweep.communicate(timeout=150)
        waited = time.monotonic() - signalled
    finally:
        sweep.kill()  # a sweep still waiting on the lock is not left behind
    assert waited < 10, f"exited {waited:.0f} s after SIGTERM: {stderr[-3000:]}"
    assert "interrupted (SIGTERM)" in stderr, stderr[-3000:]
    assert "database is locked" not in stderr, stderr[-3000:]
    assert [t.number for t in study_in(tmp_path).trials if t.state.name == "RUNNING"] == []
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("grpo").experiment_id
    assert [
        r.info.run_name for r in client.search_runs([experiment]) if r.info.status == "RUNNING"
    ] == []
    # The same command completes the point, continuing the run: every step's metric once.
    done = run_sweep(tmp_path, *ARGS)
    assert done.returncode == 0, done.stderr[-3000:]
    (completed,) = [t for t in study_in(tmp_path).trials if t.state.name == "COMPLETE"]
    history = client.get_metric_history(
        completed.user_attrs[TrialAttr.MLFLOW_RUN_ID], "reward/mean"
    )
    assert sorted(m.step for m in history) == list(range(1, 21))
