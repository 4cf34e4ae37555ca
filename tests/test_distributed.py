"""Trials that span processes (trainer/backends/distributed.py): real 2-rank runs over gloo on
CPU, one thread per rank, each rank a small model in DistributedDataParallel
(tests/dist_ranks.py). The job's reporter sees rank 0's steps; its verdict, a rank's error, a
killed rank and an interrupt end the run as a sweep trial needs, leaving no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from omegaconf import OmegaConf

from sweeper.sweep.stopping import TrialPruned
from trainer.backends.distributed import launch
from trainer.base.errors import RankLost

pytestmark = pytest.mark.slow
TESTS = Path(__file__).resolve().parent
RANKS = "dist_ranks:ddp_rank"


@pytest.fixture(autouse=True)
def ranks_import_the_tests(monkeypatch):
    """The ranks are fresh interpreters: tests/ (dist_ranks) on their path."""
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    )
    yield
    assert psutil.Process().children(recursive=True) == []  # no rank, no launcher left


class Recorder:
    """The job's reporter: records every step; may stop the run at one."""

    def __init__(self, stop_at: int | None = None, error: BaseException | None = None) -> None:
        self.steps: list[int] = []
        self.metrics: list[dict] = []
        self.stop_at, self.error = stop_at, error
        self.resumed_from: list[int | None] = []

    def resumed(self, step: int | None) -> None:
        self.resumed_from.append(step)

    def report(self, step: int, metrics: dict) -> None:
        self.steps.append(step)
        self.metrics.append(metrics)
        if step == self.stop_at:
            raise self.error


def config(out: Path, processes: int = 2, **test) -> OmegaConf:
    settings = {"steps": 4, "sleep_s": 0.0, "raise_at": None, "kill_at": None, "out": str(out)}
    return OmegaConf.create(
        {
            "backend": {"processes": processes},
            "model": {"device": "cpu"},
            "test": {**settings, **test},
        }
    )


def seen(out: Path, rank: int) -> dict:
    return json.loads((out / f"rank{rank}.json").read_text())


def test_two_ranks_finish_and_the_job_sees_every_step_once(tmp_path):
    reporter = Recorder()
    result = launch(config(tmp_path), reporter, RANKS)
    assert reporter.steps == [1, 2, 3, 4]
    assert reporter.resumed_from == [2]  # rank 0's word, once
    assert result.final_eval == reporter.metrics[-1]["loss"]
    assert reporter.metrics[-1]["loss"] < reporter.metrics[0]["loss"]  # it trained
    for rank in (0, 1):
        assert seen(tmp_path, rank) == {"world_size": 2, "threads": 1, "last_step": 4}


def test_one_and_two_ranks_take_the_same_steps(tmp_path):
    """DDP averages the ranks' gradients: on a fixed batch split in two, the loss and gradient
    of every step are those of one process on the whole batch."""
    one, two = Recorder(), Recorder()
    launch(config(tmp_path / "one", processes=1, steps=3), one, RANKS)
    launch(config(tmp_path / "two", processes=2, steps=3), two, RANKS)
    assert seen(tmp_path / "one", 0)["world_size"] == 1
    for a, b in zip(one.metrics, two.metrics, strict=True):
        assert a.keys() == b.keys() and len(a) == 6  # the loss and 5 gradient entries
        for name in a:
            assert b[name] == pytest.approx(a[name], rel=1e-5, abs=1e-6), name


def test_a_prune_stops_every_rank_at_that_step(tmp_path):
    pruned = TrialPruned(None)
    reporter = Recorder(stop_at=2, error=pruned)
    with pytest.raises(TrialPruned) as raised:
        launch(config(tmp_path, steps=6), reporter, RANKS)
    assert raised.value is pruned
    assert reporter.steps == [1, 2]
    assert [seen(tmp_path, r)["last_step"] for r in (0, 1)] == [2, 2]


def test_a_rank_that_raises_fails_the_run_with_its_error(tmp_path):
    test = {"raise_at": {"rank": 1, "step": 2}}
    with pytest.raises(ValueError) as raised:
        launch(config(tmp_path, **test), Recorder(), RANKS)
    assert str(raised.value) == "rank 1 broke at step 2"  # not rank 0's "Connection closed"
    assert raised.value.__notes__ == ["raised on rank 1 of 2"]


def test_a_killed_rank_makes_the_run_lost(tmp_path):
    test = {"kill_at": {"rank": 1, "step": 3}}
    with pytest.raises(RankLost, match="rank 1 by SIGKILL"):
        launch(config(tmp_path, **test), Recorder(), RANKS)
    assert seen(tmp_path, 1)["last_step"] == 2


def test_sigterm_to_the_job_stops_every_rank(tmp_path):
    """As in a sweep: SIGTERM is an interrupt in the job (sweeper/sweep/signals.py)."""
    script = textwrap.dedent(
        f"""
        from omegaconf import OmegaConf
        from sweeper.sweep.signals import signals_interrupt
        from trainer.backends.distributed import launch

        class Printer:
            def report(self, step, metrics):
                print("step", step, flush=True)

        cfg = OmegaConf.create({OmegaConf.to_container(config(tmp_path, steps=500, sleep_s=0.1))!r})
        with signals_interrupt():
            try:
                launch(cfg, Printer(), {RANKS!r})
            except KeyboardInterrupt as e:
                print("interrupted:", type(e).__name__, flush=True)
        """
    )
    job = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert job.stdout.readline().strip() == "step 1"  # mid-run
    family = psutil.Process(job.pid).children(recursive=True)
    assert len(family) >= 3  # the launcher and two ranks
    job.send_signal(signal.SIGTERM)
    out, _ = job.communicate(timeout=60)
    assert job.returncode == 0
    assert out.strip().splitlines()[-1] == "interrupted: SignalInterrupt"
    _, alive = psutil.wait_procs(family, timeout=5)  # orphaned ranks: reaped by init
    assert alive == []
    assert seen(tmp_path, 0)["last_step"] < 500


def test_trl_runs_as_two_ranks_under_the_launcher(tmp_path):
    """The evidence the TRL backend rests on: GRPOTrainer built in each rank, 2 steps on the
    tiny model, and accelerate sees 2 processes (its MULTI_CPU state over gloo) on each."""
    pytest.importorskip("trl", reason="the TRL backend's extra (.[trl]) is not installed")
    from tests.conftest import compose_conf
    from trainer.sampling.tiny_model import build_tiny_model

    model = build_tiny_model(compose_conf().model.tiny)
    cfg = config(tmp_path, steps=2, model=str(model))
    reporter = Recorder()
    launch(cfg, reporter, "dist_ranks:trl_rank")
    assert reporter.steps == [2] and "trl/loss" in reporter.metrics[0]
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"trl_rank{rank}.json").read_text())
        assert seen == {
            "num_processes": 2,
            "process_index": rank,
            "distributed_type": "DistributedType.MULTI_CPU",
            "world_size": 2,
        }
