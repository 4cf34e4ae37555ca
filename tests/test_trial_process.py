"""The trial process (sweeper/sweep/trial_process.py): `python -m sweeper -m ...` starts it with
the command, so a trial's imports overlap the sweep's own start, and the basic launcher's jobs
run in it. It must never outlive the sweep, and losing it must cost one job, not the sweep."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import hydra
import psutil
import pytest
from conftest import start_sweep, study_in

from sweeper.sweep import trial_process
from sweeper.sweep.trial_process import task_reference

ARGS = ["group_size=2,4", "batch_size=4", "max_steps=30", "eval_every=0", "task.eval_size=16"]
ARGS += ["save_every=3", "hydra.sweeper.health=[]"]


def a_task(cfg):
    return 0.0


@hydra.main(version_base="1.3")
def a_hydra_task(cfg):
    return 0.0


def test_a_task_is_found_by_its_module_and_name_under_hydra_main_too():
    assert task_reference(a_task) == (__name__, "a_task")
    assert task_reference(a_hydra_task.__wrapped__) == (__name__, "a_hydra_task")


def test_a_task_the_trial_process_could_not_find_by_name_is_refused():
    def nested(cfg):
        return 0.0

    assert task_reference(nested) is None
    assert task_reference(lambda cfg: 0.0) is None


@pytest.mark.parametrize(
    "argv",
    [["lr=1e-3"], ["-m", "--help"], ["-m", "--cfg", "job"], ["--multirun", "--info", "plugins"]],
)
def test_only_a_sweep_starts_it(argv):
    trial_process.start_for(argv)
    assert not trial_process.usable(a_task)


def _trial_process(sweep: subprocess.Popen, cwd: Path, timeout: float = 180) -> psutil.Process:
    """The sweep's child that holds the first trial's log open, once that trial has saved its
    second checkpoint (a signal now lands mid-training)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert sweep.poll() is None, sweep.communicate()[1][-3000:]
        if list(cwd.glob("multirun/*/*/t0/checkpoints/step_000006/state.json")):
            for child in psutil.Process(sweep.pid).children():
                if any(f.path.endswith("/t0/__main__.log") for f in child.open_files()):
                    return child
        time.sleep(0.2)
    raise TimeoutError("no trial process held t0's log by its second checkpoint")


@pytest.mark.slow
def test_it_runs_the_trials_and_dies_with_the_sweep(tmp_path):
    sweep = start_sweep(tmp_path, *ARGS, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    child = _trial_process(sweep, tmp_path)
    assert child.pid != sweep.pid
    sweep.kill()  # kill -9: nothing in the sweep runs to end it
    sweep.wait()
    _, alive = psutil.wait_procs([child], timeout=30)
    assert not alive, "the trial process trained on after its sweep was killed"


@pytest.mark.slow
def test_when_it_is_killed_its_job_is_lost_once_and_the_sweep_goes_on(tmp_path):
    sweep = start_sweep(tmp_path, *ARGS, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _trial_process(sweep, tmp_path).send_signal(signal.SIGKILL)  # the kernel's OOM killer
    stdout, stderr = sweep.communicate(timeout=600)
    assert sweep.returncode == 0, stderr[-3000:]
    assert "the trial process ended (exit code -9)" in stdout + stderr
    trials = study_in(tmp_path).trials
    completed = sorted(t.params["group_size"] for t in trials if t.state.name == "COMPLETE")
    assert completed == [2, 4]  # the lost point ran again, in the sweep's own process
