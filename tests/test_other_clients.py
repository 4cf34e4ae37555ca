"""Other clients of the same databases: a sweep starting on a fresh PostgreSQL MLflow store
while another MLflow client (an `mlflow server`, a notebook, a monitoring script) creates the
same tables waits for it and goes on, rather than dying on the duplicate key in pg_type that
the race of two CREATE TABLEs ends in. The other client does not take the project's lock."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ONE_SEED, RACE_ROUNDS
from pg_server import postgres  # noqa: F401  (fixture)
from test_database_faults import TINY, assert_every_point_complete_once

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

# MLflow's own creation of a fresh store (its initial tables, then its migrations), held open
# mid-way until a second session waits on the tables it has made but not committed: that
# session then loses the race the moment this one commits, every time.
OTHER_CLIENT = """
import sys, time
import psycopg, sqlalchemy
from mlflow.store.db.utils import InitialBase, _upgrade_db
from mlflow.tracking import MlflowClient

url = sys.argv[1]
engine = sqlalchemy.create_engine(url)
with engine.begin() as connection:
    InitialBase.metadata.create_all(connection)
    print("creating", flush=True)
    with psycopg.connect(url, autocommit=True) as watch:
        while not watch.execute(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock'"
        ).fetchone():
            time.sleep(0.05)
    print("a second client waits on our tables", flush=True)
_upgrade_db(engine)
MlflowClient(url).search_experiments()  # and then reads it, as a monitoring script does
print("created", flush=True)
"""


@pytest.mark.parametrize("attempt", range(RACE_ROUNDS))
def test_a_sweep_beside_another_mlflow_client_creating_the_store_completes(
    postgres,  # noqa: F811
    tmp_path,
    attempt,
):
    storage = postgres.database(f"optuna_other_{attempt}")
    tracking = postgres.database(f"mlflow_other_{attempt}")
    merged = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    other = subprocess.Popen([sys.executable, "-c", OTHER_CLIENT, tracking], **merged)
    assert other.stdout.readline() == "creating\n"
    worker = subprocess.run(
        [sys.executable, "-m", "sweeper", "-m", f"hydra.sweeper.storage={storage}"]
        + ["lr=1e-3", "max_steps=1", *TINY, ONE_SEED],
        cwd=tmp_path,
        env={**os.environ, "MLFLOW_TRACKING_URI": tracking},
        timeout=600,
        **merged,
    )
    told = other.communicate(timeout=300)[0]
    assert worker.returncode == 0, worker.stdout[-3000:]
    assert other.returncode == 0, told[-3000:]
    assert "a second client waits on our tables" in told  # the race did happen
    assert "another client is creating it" in worker.stdout, worker.stdout[-3000:]  # waited out
    assert_every_point_complete_once(storage, tracking, points=1)
