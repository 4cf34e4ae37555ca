"""A server restart while two workers start on a fresh PostgreSQL database: the schema lock is
a lease row (records.leases.lease), so the restart does not hand it to the waiting worker
while its holder is still creating the schema; one schema, both workers up. A session
advisory lock, which this replaced, went to the waiter the moment the server came back."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psycopg
import pytest
from pg_server import own_postgres  # noqa: F401  (fixture)

from records.leases import LEASE_HOLD_ENV

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

ROUNDS = 10
START = """
import sys
from records.optuna_storage import open_storage
open_storage(sys.argv[1])
print("up", flush=True)
"""


def until(condition, what: str, processes: list, timeout: float = 120) -> None:
    """Wait for a state the workers write (never a fixed time); fail with their output if
    one ended first."""
    deadline = time.monotonic() + timeout
    while not condition():
        for p in processes:
            assert p.poll() is None, p.communicate()[0][-3000:]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def holders(hold: Path) -> set[int]:
    return {int(p.name.split("-")[1]) for p in hold.glob("held-*")}


def test_a_restart_while_two_workers_create_the_schema_leaves_one_creator(
    own_postgres,  # noqa: F811
    tmp_path,
):
    for round_ in range(ROUNDS):
        hold = tmp_path / f"round{round_}"
        hold.mkdir()
        start_during_a_restart(own_postgres, own_postgres.database(f"restart_{round_}"), hold)


def start_during_a_restart(server, url: str, hold: Path) -> None:
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", START, url],
            env={**os.environ, LEASE_HOLD_ENV: str(hold)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    pids = {w.pid for w in workers}
    until(lambda: len(holders(hold)) == 1, "no worker took the schema lease", workers)
    (holder,) = holders(hold)
    (waiter,) = pids - {holder}
    waited = hold / f"waited-{waiter}"
    until(lambda: lines(waited) > 0, "the other worker never waited", workers)
    server.pg_ctl("restart", "-m", "fast")  # every session ended, both workers on
    before = lines(waited)
    # The waiter tries again on the restarted server: refused, while the holder is in.
    until(
        lambda: lines(waited) > before or len(holders(hold)) > 1,
        "the waiter never tried again after the restart",
        workers,
    )
    assert holders(hold) == {holder}, "the restart let both workers create the schema"
    (hold / "go").touch()
    for w in workers:
        output = w.communicate(timeout=300)[0]
        assert w.returncode == 0 and output.endswith("up\n"), output[-3000:]
    assert holders(hold) == pids  # each held it in turn
    with psycopg.connect(url) as connection:
        (versions,) = connection.execute("SELECT count(*) FROM alembic_version").fetchone()
    assert versions == 1
    assert optuna.get_all_study_names(url) == []  # a usable, empty Optuna storage
