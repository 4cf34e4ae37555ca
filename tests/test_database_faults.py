"""A database that blinks is not a failed trial. With the study and MLflow's runs in a real
PostgreSQL server (each in its own database): workers started at the same instant on fresh
databases all come up; a server restarted under a running sweep costs at most the steps since
the last checkpoint; a server that stays down stops each worker with one line, charges no
configuration a failure, and the same command resumes once it is back. And a run that kills
its own worker is lost, not failed, until it has been lost max_lost_in_a_row times."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
from conftest import ONE_SEED, RACE_ROUNDS, one_seed_unless_named, sweep_env
from mlflow.tracking import MlflowClient
from pg_server import own_postgres, postgres  # noqa: F401  (fixtures)

from analysis import load
from records.leases import SCHEMA_BARRIER_ENV
from records.sweep import Role, State, Tag, TrialAttr, is_interrupted, replicates

pytestmark = pytest.mark.slow

TINY = ["batch_size=4", "eval_every=0", "task.eval_size=16", "hydra.sweeper.health=[]"]
RESUMABLE = [*TINY, "max_steps=9", "save_every=3", "hydra.sweeper.heartbeat_interval=2"]
GRID = ["group_size=2,4", "lr=1e-3,2e-3"]


def start(cwd: Path, storage: str, tracking: str, *args: str, env: dict | None = None):
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "sweeper", "-m", f"hydra.sweeper.storage={storage}"]
        + one_seed_unless_named(args),
        cwd=cwd,
        env={**os.environ, "MLFLOW_TRACKING_URI": tracking, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(worker: subprocess.Popen, timeout: float = 600) -> str:
    return worker.communicate(timeout=timeout)[1]


def wait_for_checkpoint(
    root: Path, step: int, worker: subprocess.Popen | None = None, timeout: float = 300
) -> None:
    """Until a trial under root saved the checkpoint of `step` (failing at once, with its
    error, if the worker ended first)."""
    pattern = f"*/multirun/*/*/t*/checkpoints/step_{step:06d}/state.json"
    deadline = time.monotonic() + timeout
    while not list(root.glob(pattern)):
        assert worker is None or worker.poll() is None, finished(worker)[-3000:]
        assert time.monotonic() < deadline, f"no checkpoint of step {step} under {root}"
        time.sleep(0.2)


def trial_runs(tracking: str) -> list:
    client = MlflowClient(tracking)
    runs = client.search_runs([client.get_experiment_by_name("grpo").experiment_id])
    return [r for r in runs if r.data.tags.get(Tag.ROLE) == Role.TRIAL]


def assert_every_point_complete_once(storage: str, tracking: str, points: int) -> list:
    """Every grid point COMPLETE exactly once, nothing charged a failure, nothing left RUNNING
    in either store, one FINISHED training run per point. Returns the trials."""
    (name,) = optuna.get_all_study_names(storage)
    trials = optuna.load_study(study_name=name, storage=storage).trials
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    every = [
        (t.number, t.state.name, t.params, t.user_attrs.get(TrialAttr.FAIL_REASON)) for t in trials
    ]
    assert len(Counter(tuple(sorted(t.params.items())) for t in complete)) == points, every
    assert len(complete) == points
    states = Counter(t.state.name for t in trials if not is_interrupted(t))
    assert states == {"COMPLETE": points}, [(t.number, t.state, t.user_attrs) for t in trials]
    runs = trial_runs(tracking)
    assert [r.info.run_name for r in runs if r.info.status == "RUNNING"] == []
    finished_runs = Counter(
        r.data.tags[Tag.TRIAL_NUMBER] for r in runs if r.info.status == "FINISHED"
    )
    assert len(finished_runs) == points and set(finished_runs.values()) == {1}
    return trials


def assert_interrupted_points_resumed(trials: list) -> int:
    """Every re-queued point continued from a checkpoint; returns how many were re-queued."""
    retries = [
        t for t in trials if t.state.name == "COMPLETE" and TrialAttr.RETRY_OF in t.user_attrs
    ]
    for retry in retries:
        (seed,) = replicates(retry)
        assert seed.resumed_from_step is not None and seed.resumed_from_step >= 3, seed
        assert seed.state == State.COMPLETE and seed.steps_run == 9
    return len(retries)


@pytest.mark.postgres
@pytest.mark.parametrize("attempt", range(RACE_ROUNDS))
def test_workers_started_at_once_on_fresh_postgres_databases_all_come_up(
    postgres,  # noqa: F811
    tmp_path,
    attempt,
):
    """Each worker waits at a barrier right before it creates a store's schema, so all three
    create Optuna's and MLflow's tables at the same moment: without the schema lock the
    losers die on a duplicate key in pg_type."""
    storage = postgres.database(f"optuna_start_{attempt}")
    tracking = postgres.database(f"mlflow_start_{attempt}")
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = {SCHEMA_BARRIER_ENV: f"{barrier}:3"}
    args = ["lr=1e-3,2e-3,3e-3", "max_steps=1", *TINY]
    workers = [start(tmp_path / f"w{i}", storage, tracking, *args, env=env) for i in range(3)]
    for worker in workers:
        stderr = finished(worker)
        assert worker.returncode == 0, stderr[-3000:]
    assert len(list(barrier.iterdir())) == 6  # 3 workers x 2 stores met at the barrier
    assert_every_point_complete_once(storage, tracking, points=3)


@pytest.mark.postgres
def test_a_server_restarted_twice_under_two_workers_loses_no_configuration(
    own_postgres,  # noqa: F811
    tmp_path,
):
    storage, tracking = own_postgres.database("optuna"), own_postgres.database("mlflow")
    args = [*GRID, *RESUMABLE]
    workers = [start(tmp_path / f"w{i}", storage, tracking, *args) for i in range(2)]
    wait_for_checkpoint(tmp_path, step=3)
    own_postgres.pg_ctl("restart", "-m", "fast")  # every connection dropped mid-training
    wait_for_checkpoint(tmp_path, step=6)
    own_postgres.pg_ctl("restart", "-m", "fast")
    outputs = [finished(w) for w in workers]
    again = start(tmp_path / "w0", storage, tracking, *args)  # the same command once more
    outputs.append(finished(again))
    assert again.returncode == 0, outputs[-1][-3000:]
    codes = [w.returncode for w in [*workers, again]]
    try:
        trials = assert_every_point_complete_once(storage, tracking, points=4)
    except AssertionError as e:  # what each worker said, to tell a lost point's story
        raise AssertionError(
            f"{e}; exit codes {codes}; " + " | ".join(o[-1500:] for o in outputs)
        ) from e
    assert_interrupted_points_resumed(trials)


PAUSES_MID_RUN = '''
import os
import time

from trainer.env.tasks import AdditionTask


class PausesMidRun(AdditionTask):
    """Holds its run before the 6th batch (past the step-3 checkpoint) until the release file
    exists: the run is surely in flight when the test takes the database away."""

    batches = 0

    def train_problems(self, n, rng):
        PausesMidRun.batches += 1
        if PausesMidRun.batches == 6:
            while not os.path.exists(os.environ["RELEASE_FILE"]):
                time.sleep(0.1)
        return super().train_problems(n, rng)
'''


@pytest.mark.postgres
def test_a_server_that_stays_down_stops_the_worker_and_the_same_command_resumes(
    own_postgres,  # noqa: F811
    tmp_path,
):
    (tmp_path / "pauses.py").write_text(PAUSES_MID_RUN)
    release = tmp_path / "release"
    env = {"RELEASE_FILE": str(release), "PYTHONPATH": _with_path(tmp_path)}
    storage, tracking = own_postgres.database("optuna"), own_postgres.database("mlflow")
    args = ["group_size=2,4", *RESUMABLE, "hydra.sweeper.db_retry_seconds=3",
            "task._target_=pauses.PausesMidRun"]  # fmt: skip
    worker = start(tmp_path / "w0", storage, tracking, *args, env=env)
    wait_for_checkpoint(tmp_path, step=3, worker=worker)
    own_postgres.pg_ctl("stop", "-m", "fast")
    stopped = time.monotonic()
    release.touch()
    stderr = finished(worker, timeout=120)
    assert time.monotonic() - stopped < 60  # the retry window (twice at most), not minutes
    assert worker.returncode == 1
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "the database is unreachable (retried for 3 s" in last
    assert "127.0.0.1" in last and last.endswith("resume with the same command once it is back")

    own_postgres.pg_ctl("start")
    time.sleep(5)  # past the heartbeat's grace period: the trial in flight is found stale
    again = start(tmp_path / "w0", storage, tracking, *args, env=env)
    stderr = finished(again)
    assert again.returncode == 0, stderr[-3000:]
    trials = assert_every_point_complete_once(storage, tracking, points=2)
    assert assert_interrupted_points_resumed(trials) == 1


def _with_path(folder: Path) -> str:
    return f"{folder}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"


KILLS_ITS_WORKER = '''
import os
import signal

from trainer.env.tasks import AdditionTask


class KillsItsWorker(AdditionTask):
    """Dies as a run killed for memory does: SIGKILL, nothing recorded."""

    def train_problems(self, n, rng):
        os.kill(os.getpid(), signal.SIGKILL)
'''


def test_a_run_that_kills_its_worker_is_retried_then_fails_with_the_reason(tmp_path):
    """Lost, not failed: the point is queued again, and after max_lost_in_a_row losses in a
    row it fails with the reason instead of looping forever."""
    (tmp_path / "killer.py").write_text(KILLS_ITS_WORKER)
    done = subprocess.run(
        [sys.executable, "-m", "sweeper", "-m", "hydra/launcher=joblib", "group_size=2",
         "task._target_=killer.KillsItsWorker", "max_steps=2", *TINY,
         "hydra.sweeper.max_lost_in_a_row=2", "hydra.sweeper.max_failure_rate=1", ONE_SEED],
        cwd=tmp_path,
        env={**sweep_env(tmp_path),
             "PYTHONPATH": _with_path(tmp_path)},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (name,) = optuna.get_all_study_names(f"sqlite:///{tmp_path}/sweeps.db")
    trials = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path}/sweeps.db").trials
    first, second = sorted(trials, key=lambda t: t.number)
    assert is_interrupted(first) and first.user_attrs[TrialAttr.LOST_IN_A_ROW] == 1
    assert first.user_attrs[TrialAttr.FAIL_REASON].startswith("lost: its job died")
    assert second.user_attrs[TrialAttr.RETRY_OF] == first.number
    assert second.state.name == "FAIL" and not is_interrupted(second)
    assert second.user_attrs[TrialAttr.FAIL_REASON].startswith("lost 2 times in a row")
    runs = trial_runs(f"sqlite:///{tmp_path}/mlflow.db")
    # the retry continued the point's one run (one record per point) and failed it
    assert len(runs) == 1 and {r.info.status for r in runs} == {"FAILED"}


def test_the_analysis_waits_out_a_store_locked_by_a_writer(tmp_path):
    """`python -m analysis report` on a busy store: a writer holds the SQLite file longer
    than a reader's lock wait; the reader retries, as the sweep does, and reads the study."""
    import sqlite3
    import threading

    url = f"sqlite:///{tmp_path}/study.db"
    study = optuna.create_study(storage=url, study_name="busy")
    study.enqueue_trial({"x": 1})
    writer = sqlite3.connect(tmp_path / "study.db", isolation_level=None, check_same_thread=False)
    writer.execute("BEGIN EXCLUSIVE")  # readers too must wait (rollback journal)
    released = threading.Timer(13, writer.execute, ["COMMIT"])
    released.start()
    try:
        started = time.monotonic()
        data = load.load_study(url, with_mlflow=False)
        assert time.monotonic() - started >= 12  # it did wait for the writer
    finally:
        released.join()
        writer.close()
    assert (data.name, [t.state for t in data.trials]) == ("busy", ["waiting"])


def test_after_an_outage_a_trial_is_taken_over_only_once_the_grace_has_passed_again(tmp_path):
    """Heartbeats carry the database's clock: a trial silent only because the store was away
    looks stale the moment it returns. Its grace counts from the store's return."""
    import sqlite3
    from types import SimpleNamespace

    import sqlalchemy

    from records.database import retried
    from records.optuna_storage import open_storage
    from sweeper import optuna_adapter as oa
    from sweeper.sweep.tell import give_back_lost

    url = f"sqlite:///{tmp_path}/study.db"
    study = optuna.create_study(storage=open_storage(url, 1, 2), study_name="s")
    trial = study.ask()
    oa.record_heartbeat(study, trial._trial_id)
    time.sleep(2.5)  # its worker is silent past the grace: the store was away
    # The store away, as this worker saw it: a real call that failed once, then came back.
    writer = sqlite3.connect(tmp_path / "study.db", isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")
    engine = sqlalchemy.create_engine(url, connect_args={"timeout": 0.1})

    tries = []

    def read() -> int:
        tries.append(1)
        try:
            with engine.connect() as connection:
                return connection.execute(sqlalchemy.text("SELECT count(*) FROM trials")).scalar()
        finally:
            if len(tries) == 1:
                writer.execute("COMMIT")  # back for the retry

    assert retried(read, "test") == 1 and len(tries) == 2
    writer.close()
    settings = SimpleNamespace(
        fail_stale_trials=True,
        grace_period=2,
        heartbeat_interval=1,
        storage=url,
        max_lost_in_a_row=3,
    )
    give_back_lost(study, settings, "s")
    assert [t.state.name for t in study.get_trials()] == ["RUNNING"]  # not taken over yet
    time.sleep(2.2)  # the grace again, counted from the store's return: now it is lost
    give_back_lost(study, settings, "s")
    assert [t.state.name for t in study.get_trials()] == ["FAIL", "WAITING"]


@pytest.mark.postgres
def test_a_paused_server_counts_as_an_outage_though_no_call_failed(own_postgres):  # noqa: F811
    """A server that stalls (every process SIGSTOPped) makes calls wait, not fail: the call
    that waited it out still marks the outage, so others' heartbeats, as late as it was, are
    not read as deaths until the grace has passed again."""
    import threading

    import sqlalchemy

    from records.database import SLOW_CALL_S, calm_for, retried

    engine = sqlalchemy.create_engine(own_postgres.database("paused"))
    with engine.connect() as connection:  # connected before the pause, as a worker's pool is
        pause = threading.Thread(target=own_postgres.paused, args=(SLOW_CALL_S + 2,))
        pause.start()
        time.sleep(0.5)
        started = time.monotonic()
        assert retried(lambda: connection.execute(sqlalchemy.text("SELECT 1")).scalar(), "t") == 1
        waited = time.monotonic() - started
        pause.join()
    assert waited > SLOW_CALL_S
    assert calm_for() < 1  # counted from the call's end: the server's return


def test_a_metric_write_retried_after_an_outage_first_asks_whether_the_job_is_still_its_own(
    own_postgres,  # noqa: F811
):
    """A cut long enough for another worker to take the job over: the cut-off worker's write,
    retried once the server answers again, must not land (the other worker logs that step).
    So before a retry the run asks `still_ours`, which raises for a job taken over; the step
    is never written. Found as a step logged twice in tests/test_hosts_apart.py."""
    import threading

    from records.tracking import MLflowRun
    from records.tracking_store import tracking_client
    from sweeper.sweep.stopping import TakenOver

    client = tracking_client(own_postgres.database("mlflow_retry"))
    run = MLflowRun("retry", "t0", client=client)
    run.log_metrics(0, {"reward/mean": 0.1})
    asked = threading.Event()

    def taken_over() -> None:
        asked.set()
        raise TakenOver("t0 was taken over by another worker")

    run.still_ours = taken_over
    own_postgres.pg_ctl("stop", "-m", "fast")  # every connection dropped, none accepted
    try:
        with pytest.raises(TakenOver):
            run.log_metrics(1, {"reward/mean": 0.2})  # fails, then asks before trying again
    finally:
        own_postgres.pg_ctl("start")
    assert asked.is_set()
    history = client.get_metric_history(run.run_id, "reward/mean")
    assert [m.step for m in history] == [0]
