"""Throwaway PostgreSQL servers for the shared-study tests, started by the tests themselves.

Uses Debian's `postgresql` package when installed (.ci/run installs it); otherwise the tests
that need it are skipped. GRPO_SWEEPER_TEST_POSTGRES=<url> points `postgres` at a server you
run. `own_postgres` is a server of the test's own, which the test may stop and restart.
"""

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import free_port


class PostgresServer:
    """Hands out one database per name: Optuna and MLflow each keep an `alembic_version`
    table, so they cannot share a database (they can share a server)."""

    def __init__(self, base_url: str, control: list[str] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.control = control  # pg_ctl and its arguments, for a server of our own

    def database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.base_url + "/postgres", autocommit=True) as connection:
            found = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if found.fetchone() is None:
                connection.execute(f'CREATE DATABASE "{name}"')
        return f"{self.base_url}/{name}"

    def pg_ctl(self, *action: str) -> None:
        """e.g. pg_ctl("restart", "-m", "fast"): what a maintenance restart or a failover does
        to the clients (every connection dropped, the server away for a moment)."""
        assert self.control is not None, "not a server these tests started"
        subprocess.run([*self.control, *action], check=True, capture_output=True, timeout=60)

    def paused(self, seconds: float) -> None:
        """Every server process stopped (SIGSTOP) for `seconds`, then continued: a host that
        stalls or a network that holds packets. Calls wait rather than fail meanwhile."""
        import psutil

        data = Path(self.control[self.control.index("-D") + 1])
        postmaster = psutil.Process(int((data / "postmaster.pid").read_text().split()[0]))
        processes = [postmaster, *postmaster.children(recursive=True)]
        for process in processes:
            process.send_signal(signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            for process in processes:
                process.send_signal(signal.SIGCONT)


@contextlib.contextmanager
def started_server(
    listen: tuple[str, ...] = ("127.0.0.1",), trusted: str = "", settings: tuple[str, ...] = ()
) -> Iterator[PostgresServer]:
    """listen: addresses it listens on; trusted: a network whose clients it lets in beside
    127.0.0.1 (tests/net_hosts.py's links); settings: more `name=value` server settings."""
    bindirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not bindirs:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    bindir = bindirs[-1]
    data = tempfile.mkdtemp(prefix="grpo-sweeper-pg-")
    # The server refuses to run as root: run it as Debian's postgres user then.
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_user:
        shutil.chown(data, "postgres")
    port = free_port()
    options = f"-p {port} -k {data} -c listen_addresses={','.join(listen)} -c fsync=off"
    options += "".join(f" -c {setting}" for setting in ("max_connections=200", *settings))
    subprocess.run(
        [*as_user, f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync"],
        check=True,
        capture_output=True,
    )
    if trusted:
        with open(f"{data}/pg_hba.conf", "a") as hba:
            hba.write(f"host all all {trusted} trust\n")
    control = [*as_user, f"{bindir}/pg_ctl", "-D", data, "-o", options, "-l", f"{data}/log", "-w"]
    server = PostgresServer(f"postgresql://postgres@127.0.0.1:{port}", control)
    server.pg_ctl("start")
    try:
        yield server
    finally:
        subprocess.run([*control, "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres():
    if os.environ.get("GRPO_SWEEPER_TEST_POSTGRES"):  # a server URL without a database
        yield PostgresServer(os.environ["GRPO_SWEEPER_TEST_POSTGRES"])
        return
    with started_server() as server:
        yield server


@pytest.fixture
def own_postgres():
    """A server for this test alone: it may stop or restart it."""
    with started_server() as server:
        yield server
