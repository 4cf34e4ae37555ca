"""A run's CPU threads (trainer/model/cpu_threads.py): the rule on hand-computed cases, the
host facts it reads (affinity, a container's quota, other processes' CPU time), and a real run
that records the count it used, an override winning."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from records import metrics
from trainer.backends import train
from trainer.base.errors import ConfigError
from trainer.model import cpu_threads
from trainer.model.cpu_threads import choose
from trainer.run.validation import validate


@pytest.mark.parametrize(
    ("cores", "runs", "busy", "expected"),
    [
        (2, 1, 0.0, 2),  # alone: every core
        (2, 1, 0.4, 2),  # a core counts as taken above half of it
        (2, 1, 0.6, 1),
        (2, 1, 1.0, 1),  # beside one busy process
        (2, 1, 3.0, 1),  # never fewer than one
        (8, 2, 0.0, 4),  # the sweep's two lanes share the cores
        (8, 3, 3.0, 2),  # 8 // 3 = 2, and 8 - 3 = 5 are free
        (8, 1, 5.0, 3),
        (2, 4, 0.0, 1),
        (1, 1, 0.0, 1),
    ],
)
def test_the_rule_on_hand_computed_cases(cores, runs, busy, expected):
    assert choose(cores, runs, busy).count == expected


def test_the_reason_names_what_decided():
    assert choose(2, 1, 0.0).why == "2 cores"
    assert choose(8, 2, 3.0).why == "8 cores, 2 runs at once, 3.0 busy elsewhere"


def test_a_containers_quota_caps_the_cores(tmp_path):
    assert cpu_threads.cgroup_quota(tmp_path) is None  # no cgroup files: no limit
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpu_threads.cgroup_quota(tmp_path) is None
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # cgroup v2: 1.5 cores
    assert cpu_threads.cgroup_quota(tmp_path) == 1.5
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")  # cgroup v1: 3 cores
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_threads.cgroup_quota(tmp_path) == 3.0


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_a_process_pinned_to_one_core_counts_one():
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))});"
        "from trainer.model.cpu_threads import usable_cores; print(usable_cores())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "1"


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads Linux's /proc/stat")
def test_a_busy_process_beside_is_seen(tmp_path):
    spinning = tmp_path / "spinning"
    code = f"open({str(spinning)!r}, 'w').close()\nwhile True: pass"
    spinner = subprocess.Popen([sys.executable, "-c", code])
    try:
        while not spinning.exists():  # its loop starts right after the file
            assert spinner.poll() is None
        # At least the spinner's core is busy all the look long (more with other work beside).
        assert cpu_threads.busy_elsewhere(0.5) >= 0.7
    finally:
        spinner.kill()
        spinner.wait()


def test_a_bad_setting_is_one_line_naming_it(composed):
    for bad in ("0", "-2", "many", "true"):
        with pytest.raises(ConfigError, match=r"model.threads=.*must be auto or a whole number"):
            validate(composed(f"model.threads={bad}"))


@pytest.fixture
def torch_threads():
    """This worker's thread count, put back after a run changed it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_a_run_records_its_threads_and_an_override_wins(
    composed, new_recorder, torch_threads, monkeypatch
):
    monkeypatch.delenv(cpu_threads.USER_VARIABLE, raising=False)
    # auto, as many runs at once as cores: one core each, whatever else runs
    monkeypatch.setenv(cpu_threads.RUNS_AT_ONCE, str(cpu_threads.usable_cores()))
    for setting, expected in (("auto", 1), ("2", 2)):
        recorder = new_recorder()
        train(composed("max_steps=1", "task.eval_size=8", f"model.threads={setting}"), recorder)
        assert recorder.decided[metrics.THREADS_PARAM] == expected
        assert torch.get_num_threads() == expected


@pytest.mark.slow
def test_the_users_omp_num_threads_is_kept(composed, new_recorder, torch_threads, monkeypatch):
    torch.set_num_threads(2)  # as torch sets it from OMP_NUM_THREADS=2 when it starts
    monkeypatch.setenv(cpu_threads.USER_VARIABLE, "2")
    recorder = new_recorder()
    train(composed("max_steps=1", "task.eval_size=8"), recorder)
    assert recorder.decided[metrics.THREADS_PARAM] == 2
