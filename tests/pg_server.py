"""A throwaway PostgreSQL server for the shared-study tests, started by the tests themselves.

Uses Debian's `postgresql` package when installed (.ci/run installs it); otherwise the tests
that need it are skipped. GRPO_SWEEPER_TEST_POSTGRES=<url> points them at a server you run.
"""

import glob
import os
import shutil
import subprocess
import tempfile

import pytest
from conftest import free_port


class PostgresServer:
    """Hands out one database per name: Optuna and MLflow each keep an `alembic_version`
    table, so they cannot share a database (they can share a server)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    def database(self, name: str) -> str:
        import psycopg2

        dsn = self.base_url.replace("postgresql+psycopg2://", "postgresql://") + "/postgres"
        connection = psycopg2.connect(dsn)
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if cursor.fetchone() is None:
                cursor.execute(f'CREATE DATABASE "{name}"')
        connection.close()
        return f"{self.base_url}/{name}"


@pytest.fixture(scope="session")
def postgres():
    if os.environ.get("GRPO_SWEEPER_TEST_POSTGRES"):  # a server URL without a database
        yield PostgresServer(os.environ["GRPO_SWEEPER_TEST_POSTGRES"])
        return
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
    options = (
        f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    )
    subprocess.run(
        [*as_user, f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync"],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            *as_user,
            f"{bindir}/pg_ctl",
            "-D",
            data,
            "-o",
            options,
            "-l",
            f"{data}/log",
            "-w",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        yield PostgresServer(f"postgresql+psycopg2://postgres@127.0.0.1:{port}")
    finally:
        subprocess.run(
            [*as_user, f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "stop"],
            capture_output=True,
        )
        shutil.rmtree(data, ignore_errors=True)
