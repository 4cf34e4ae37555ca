"""Another client of a fresh SQLite store (a notebook polling mlflow.search_runs, a script
polling optuna.load_study) creating its tables at the same moment as the sweep: the sweep
waits for it or makes the store in one transaction, and never dies for it. A store left
half-made by a client that crashed is completed, or refused in one line naming the file.

The other client is unmodified MLflow or Optuna and takes no lock of ours. Each round, the
sweep waits at the schema barrier (records/leases.py) right before it opens a store, the
client joins that barrier and starts creating the same store at once: the two creations
overlap in every round. On main (8789f6c) this killed the sweep (docs/reliability.md).
Each kind of client gets ROUNDS rounds: CLI_ROUNDS real sweeps, the rest the sweep's own
store-opening code (tracking_client, open_storage) in this process, which is cheaper. Since
the barrier forces the overlap, one real sweep a kind proves the CLI path; the in-process rounds
vary where in the client's creation the sweep's lands (GRPO_SWEEPER_RACE_ROUNDS scales both).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from conftest import ONE_SEED, RACE_ROUNDS
from mlflow.store.db import utils as mlflow_db
from mlflow.tracking import MlflowClient
from optuna.storages._rdb import models as optuna_models
from test_database_faults import TINY

from records import sqlite_schema
from records.leases import SCHEMA_BARRIER_ENV
from records.optuna_storage import open_storage
from records.tracking import MLflowRun
from records.tracking_store import tracking_client

pytestmark = pytest.mark.slow

CLI_ROUNDS = RACE_ROUNDS
ROUNDS = 6 * RACE_ROUNDS
KINDS = ("mlflow", "optuna")
STORE_FILE = {"mlflow": "mlflow.db", "optuna": "sweeps.db"}

# The other client: for each round folder in turn, it joins the sweep's barrier for every
# store that reaches it, begins polling its own store the moment it has joined that one's,
# and polls until the round's `stop` file exists, then once more. A poll that fails is the
# client's own business (printed); the store it then reads must be the whole one the sweep made
# (its last poll, after the sweep's write, must read it: polls in between may all have failed).
OTHER_CLIENT = r"""
import os, sys, time, zlib
from pathlib import Path

kind, folders = sys.argv[1], sys.argv[2:]
if kind == "mlflow":
    import mlflow
else:
    import optuna
    optuna.logging.set_verbosity(optuna.logging.ERROR)


def poll(url):
    if kind == "mlflow":
        mlflow.set_tracking_uri(url)
        mlflow.search_runs(search_all_experiments=True)
    elif optuna.get_all_study_names(url):
        optuna.load_study(study_name=None, storage=url)


for folder in map(Path, folders):
    url = f"sqlite:///{folder}/{'mlflow.db' if kind == 'mlflow' else 'sweeps.db'}"
    mine, joined = f"{zlib.crc32(url.encode()):08x}", set()
    while not (folder / "barrier").is_dir():
        time.sleep(0.01)
    print("ready", flush=True)
    ok, errors, last = 0, [], False
    while not last:
        last = (folder / "stop").exists()  # one poll more after it: the store is whole by then
        for waiting in (folder / "barrier").iterdir():
            tag = waiting.name.split("-")[0]
            if tag not in joined:
                (folder / "barrier" / f"{tag}-{os.getpid()}").touch()
                joined.add(tag)
        if mine not in joined:
            time.sleep(0.01)
            continue
        try:
            poll(url)
            ok += 1
        except Exception as e:
            errors.append(f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}")
        time.sleep(0.05)
    print(f"polled {ok} ok, {len(errors)} failed: {sorted(set(errors))}", flush=True)
"""


@contextlib.contextmanager
def other_client(kind: str, folders: list[Path]) -> Iterator[subprocess.Popen]:
    """The client, serving the round folders in turn; stopped when the test ends."""
    client = subprocess.Popen(
        [sys.executable, "-c", OTHER_CLIENT, kind, *map(str, folders)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # MLflow's INFO lines; its failures are in its summary
        text=True,
    )
    try:
        yield client
    finally:
        client.kill()
        client.wait()


def round_folder(root: Path) -> Path:
    """A fresh folder whose barrier the sweep waits at until the client joins it."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "barrier").mkdir()
    return root


def finished(client: subprocess.Popen, folder: Path) -> str:
    """Stop the client's round: its summary line."""
    (folder / "stop").touch()
    line = client.stdout.readline()
    assert line.startswith("polled "), line
    return line.strip()


def assert_store_whole(kind: str, path: Path) -> None:
    """The store is at its library's head revision, with no table a migration left behind."""
    tables = {row[0] for row in sqlite3.connect(path).execute("SELECT name FROM sqlite_master")}
    assert not [t for t in tables if t.startswith("_alembic_tmp")], sorted(tables)
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    if kind == "mlflow":
        assert mlflow_db._get_schema_version(engine) == mlflow_db._get_latest_schema_revision()
    else:  # Optuna refuses a store whose version it does not know
        optuna.storages.RDBStorage(f"sqlite:///{path}")
    engine.dispose()


def cheapest_sweep(cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """One trial of one training step on the default stores (SQLite files in cwd)."""
    defaults = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return subprocess.run(
        [sys.executable, "-m", "sweeper", "-m", "lr=1e-3", "max_steps=1", *TINY, ONE_SEED],
        cwd=cwd,
        env={**defaults, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("attempt", range(CLI_ROUNDS))
def test_a_sweep_beside_a_client_creating_its_fresh_store_completes(tmp_path, kind, attempt):
    folder = round_folder(tmp_path)
    with other_client(kind, [folder]) as client:
        assert client.stdout.readline() == "ready\n"
        sweep = cheapest_sweep(folder, {SCHEMA_BARRIER_ENV: f"{folder / 'barrier'}:2"})
        told = finished(client, folder)
    assert sweep.returncode == 0, f"{told}\n{sweep.stdout[-3000:]}"
    assert "Traceback" not in sweep.stdout, sweep.stdout[-3000:]
    assert not told.startswith("polled 0 ok"), told  # the client read the store made
    assert len(list((folder / "barrier").iterdir())) == 4, told  # both met at both stores
    for each in KINDS:
        assert_store_whole(each, folder / STORE_FILE[each])
    storage = f"sqlite:///{folder}/sweeps.db"
    (name,) = optuna.get_all_study_names(storage)
    (trial,) = optuna.load_study(study_name=name, storage=storage).trials
    assert trial.state.name == "COMPLETE"


@pytest.mark.parametrize("kind", KINDS)
def test_the_sweeps_store_opening_beside_a_client_creating_it_never_fails(
    tmp_path, monkeypatch, kind
):
    folders = [tmp_path / f"r{n}" for n in range(ROUNDS - CLI_ROUNDS)]
    with other_client(kind, folders) as client:
        for folder in folders:
            round_folder(folder)
            assert client.stdout.readline() == "ready\n"
            monkeypatch.setenv(SCHEMA_BARRIER_ENV, f"{folder / 'barrier'}:2")
            try:
                written_to(kind, f"sqlite:///{folder}/{STORE_FILE[kind]}")
            except Exception as e:
                pytest.fail(f"{folder.name}: {e!r}; the client: {finished(client, folder)}")
            told = finished(client, folder)
            assert not told.startswith("polled 0 ok"), told  # the client read the store made
            assert len(list((folder / "barrier").iterdir())) == 2
            assert_store_whole(kind, folder / STORE_FILE[kind])


def written_to(kind: str, url: str) -> None:
    """The sweep's own opening of a store, then a write through it, read back."""
    if kind == "mlflow":
        run = MLflowRun("grpo", "written", client=tracking_client(url))
        run.end()
        assert run.status == "FINISHED"
    else:
        storage = open_storage(url, patient=False)
        optuna.create_study(storage=storage, study_name="written")
        assert optuna.get_all_study_names(storage) == ["written"]


def half_migrated_mlflow_store(path: Path, with_first_column: bool) -> None:
    """What a client killed while creating an MLflow store leaves: its initial tables, and,
    with_first_column, the first statement of its first migration (metrics.step)."""
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    mlflow_db.InitialBase.metadata.create_all(engine)
    if with_first_column:
        with engine.begin() as connection:
            connection.exec_driver_sql(
                "ALTER TABLE metrics ADD COLUMN step BIGINT DEFAULT '0' NOT NULL"
            )
    engine.dispose()


def test_a_half_migrated_mlflow_store_is_refused_in_one_line(tmp_path):
    store = tmp_path / "mlflow.db"
    half_migrated_mlflow_store(store, with_first_column=True)
    before = store.read_bytes()
    sweep = cheapest_sweep(tmp_path)
    assert sweep.returncode == 1, sweep.stdout[-3000:]
    assert "Traceback" not in sweep.stdout, sweep.stdout[-3000:]
    last = sweep.stdout.strip().splitlines()[-1]
    assert last.startswith("error: MLFLOW_TRACKING_URI="), last
    assert f"{store} cannot be completed (" in last, last
    assert "duplicate column name: step" in last, last
    assert "mlflow db upgrade" in last, last
    assert store.read_bytes() == before  # the attempt to complete it was rolled back


def test_a_store_whose_maker_stopped_between_steps_is_completed(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_schema, "QUIET_S", 1.0)  # not the 30 s a real wait takes
    mlflow_store = tmp_path / "mlflow.db"
    half_migrated_mlflow_store(mlflow_store, with_first_column=False)
    run = MLflowRun("grpo", "written", client=tracking_client(f"sqlite:///{mlflow_store}"))
    assert MlflowClient(f"sqlite:///{mlflow_store}").get_run(run.run_id)
    assert_store_whole("mlflow", mlflow_store)

    optuna_store = tmp_path / "sweeps.db"  # tables made, no version row: stopped right there
    engine = sqlalchemy.create_engine(f"sqlite:///{optuna_store}")
    optuna_models.BaseModel.metadata.create_all(engine)
    engine.dispose()
    storage = open_storage(f"sqlite:///{optuna_store}", patient=False)
    optuna.create_study(storage=storage, study_name="written")
    assert_store_whole("optuna", optuna_store)


def test_the_analysis_refuses_a_store_two_clients_half_made_in_one_line(tmp_path):
    store = tmp_path / "sweeps.db"  # both stamped their alembic revision: two rows, no head
    optuna.storages.RDBStorage(f"sqlite:///{store}").engine.dispose()
    with sqlite3.connect(store) as connection:
        connection.execute("INSERT INTO alembic_version VALUES ('v3.0.0.a')")
    before = store.read_bytes()
    told = subprocess.run(
        [sys.executable, "-m", "analysis", "best", "--storage", f"sqlite:///{store}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert told.returncode == 1, told.stderr[-3000:]
    assert "Traceback" not in told.stderr, told.stderr[-3000:]
    waited, line = told.stderr.strip().splitlines()  # it waited for a maker that had stopped
    assert waited.endswith(
        "another client may be creating or upgrading it; waiting until it is whole"
    )
    assert line.startswith(f"error: the Optuna storage sqlite:///{store}: {store} cannot be"), line
    assert "optuna storage upgrade" in line, line
    assert store.read_bytes() == before
