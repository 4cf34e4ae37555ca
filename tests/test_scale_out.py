"""Many workers, one study: PostgreSQL for Optuna, an MLflow server on PostgreSQL for runs.

Four `python -m sweeper` processes started with the same command share the study: together
they cover a grid exactly once and spend a TPE budget of n_trials in total.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter

import optuna
import pytest
from conftest import ONE_SEED, free_port, sweep_env
from mlflow.tracking import MlflowClient
from pg_server import postgres  # noqa: F401  (fixture)

from records.leases import SCHEMA_BARRIER_ENV

# Health rules off: these tests are the infrastructure's, and on an 8-problem eval one problem
# (0.125) is past eval_collapse's 0.1 bound, which pruned both trials of a healthy sweep on an
# Intel Xeon host's tiny model.
TINY = [
    "max_steps=1", "batch_size=2", "eval_every=0", "task.eval_size=8", "hydra.sweeper.health=[]"
]  # fmt: skip


@pytest.fixture(scope="module")
def mlflow_server(postgres, tmp_path_factory):  # noqa: F811
    port = free_port()
    artifacts = tmp_path_factory.mktemp("artifacts")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", postgres.database("mlflow"), "--artifacts-destination", str(artifacts),
         "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip

    def stop() -> None:
        # the whole group: killing `mlflow server` alone left its uvicorn, job runner and
        # huey consumers (which outlast a SIGTERM) running
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()

    url = f"http://127.0.0.1:{port}"
    # Until it answers or exits: 60 s was not always enough for it to come up on a busy host.
    deadline = time.monotonic() + 600
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1).close()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                stop()
                pytest.fail("mlflow server did not start")
            time.sleep(0.5)
    yield url
    stop()


def start_workers(n, cwd, storage, tracking_uri, *overrides, env=None):
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, **(env or {})}
    command = [
        sys.executable,
        "-m",
        "sweeper",
        "-m",
        f"hydra.sweeper.storage={storage}",
        *overrides,
        *[o for o in TINY if o.split("=")[0] not in {v.split("=")[0] for v in overrides}],
    ]
    workers = []
    for i in range(n):
        (cwd / f"w{i}").mkdir()
        workers.append(
            subprocess.Popen(
                command,
                cwd=cwd / f"w{i}",
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [w.communicate(timeout=900)[0] for w in workers]
    for worker, output in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, output[-3000:]
    return outputs


@pytest.mark.slow
@pytest.mark.postgres
def test_four_workers_cover_a_grid_exactly_once(postgres, mlflow_server, tmp_path):  # noqa: F811
    storage = postgres.database("optuna_grid")
    start_workers(4, tmp_path, storage, mlflow_server, "hydra.sweeper.study_name=shared-grid",
                  "group_size=2,4", "lr=1e-3,2e-3,3e-3")  # fmt: skip
    study = optuna.load_study(study_name="shared-grid", storage=storage)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert all("group_size" in t.params for t in complete), [
        (t.number, t.state, t.params, t.user_attrs) for t in study.trials
    ]
    points = Counter((t.params["group_size"], t.params["lr"]) for t in complete)
    assert sorted(points) == [(g, lr) for g in (2, 4) for lr in (1e-3, 2e-3, 3e-3)]
    assert set(points.values()) == {1}, [  # each combination exactly once
        (t.number, t.state.name, t.params, t.system_attrs, t.user_attrs) for t in study.trials
    ]

    client = MlflowClient(mlflow_server)
    runs = client.search_runs([client.get_experiment_by_name("grpo").experiment_id])
    parents = [
        r
        for r in runs
        if r.data.tags.get("sweeper.role") == "study"
        and r.data.tags.get("sweeper.study") == "shared-grid"
    ]
    assert len(parents) == 1
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    finished = [r for r in children if r.info.status == "FINISHED"]
    assert len(finished) == 6


@pytest.mark.slow
@pytest.mark.postgres
def test_four_workers_share_one_tpe_budget(postgres, mlflow_server, tmp_path):  # noqa: F811
    storage = postgres.database("optuna_tpe")
    # All four wait at a barrier right before the study's schema, so they reach the study
    # together: short trials cannot all go to one worker that came up first (before the
    # barrier, trials of 60 steps made that unlikely at the cost of the test's time).
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    outputs = start_workers(
        4,
        tmp_path,
        storage,
        mlflow_server,
        "hydra.sweeper.study_name=shared-tpe",
        "hydra.sweeper.n_trials=6",
        "group_size=2",
        "lr=tag(log, interval(1e-4, 1e-2))",
        "max_steps=10",
        env={SCHEMA_BARRIER_ENV: f"{barrier}:4"},
    )
    assert len(list(barrier.iterdir())) == 4  # each worker met the barrier
    study = optuna.load_study(study_name="shared-tpe", storage=storage)
    finished = [t for t in study.trials if t.state.is_finished()]
    assert len(finished) == 6, [  # one budget: not 6 a worker
        (t.number, t.state.name, t.user_attrs) for t in study.trials
    ]
    assert all(1e-4 <= t.params["lr"] <= 1e-2 for t in finished)
    takers = [out.count(" started") for out in outputs]
    assert sum(n > 0 for n in takers) >= 2, takers  # the budget was shared, not one worker's


@pytest.mark.slow
def test_submitit_launcher_runs_trials_as_separate_jobs(tmp_path):
    # submitit_local pickles each trial into its own process, exactly as submitit_slurm
    # submits it to a cluster; the trial reaches its study through the storage URL.
    env = sweep_env(tmp_path)
    command = [sys.executable, "-m", "sweeper", "-m", "hydra/launcher=submitit_local",
               "hydra.sweeper.n_jobs=2", "hydra.sweeper.study_name=submitit",
               "group_size=2,4", "lr=2e-3", *TINY, ONE_SEED]  # fmt: skip
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    study = optuna.load_study(study_name="submitit", storage=f"sqlite:///{tmp_path}/sweeps.db")
    assert sorted(t.params["group_size"] for t in study.trials if t.state.name == "COMPLETE") == [
        2,
        4,
    ]
    assert list(tmp_path.glob("multirun/**/.submitit"))  # the jobs really went through submitit
