"""Leases: locks on a PostgreSQL database that a server restart does not drop, held by one
process at a time for what several must not do at once (create a schema, change a plan); the
fencing that refuses a write under a lease taken over; and `schema_lock`, one store creation at
a time on any database. Taking and renewing a lease is retried as records/database.py retries.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import multiprocessing
import os
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from records.database import (
    DatabaseUnreachable,
    created_despite_others,
    is_unreachable,
    retried,
    scheme,
)
from records.errors import first_line
from records.locks import flocked

log = logging.getLogger(__name__)

# Tests only: "<folder>:<n>" makes n processes wait for each other right before they create
# a store's schema, so that the race the schema lock prevents happens every time.
SCHEMA_BARRIER_ENV = "GRPO_SWEEPER_TEST_SCHEMA_BARRIER"


@functools.cache
def _lock_engine(url: str) -> Any:
    import sqlalchemy
    import sqlalchemy.pool

    # No pool: a lease's session is its own, and a dropped one is simply opened again.
    return sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)


# --- leases: locks a server restart does not drop ----------------------------------------
# A session advisory lock dies with the server: after a restart a waiter takes it while its
# holder, reconnected, goes on in the block. A lease is a row (name, owner, the holder's
# backend pid, when it was last renewed, its expiry and a fencing token), so it outlives a
# restart. Who may take a lease someone else holds, judged on the database's clock alone
# (a host's skewed clock never enters):
#  - its holder's session ended on this server instance (killed, or its connection dropped):
#    at once, as an advisory lock would be let go;
#  - it was last renewed before the server (re)started: once it expires; its holder renews
#    it from a new session every LEASE_S / 6 meanwhile, as soon as the server is back.
# A holder alive on a live session (even one stopped by SIGSTOP) is never overtaken.
LEASE_S = 60
LEASE_TABLE = "grpo_sweeper_leases"
LEASE_POLL_S = 0.2
# Tests only: a folder; the holder of a "schema" lease writes `held-<pid>` there once it has
# it, and leaves only when `go` exists; each waiter's failed take appends to `waited-<pid>`.
LEASE_HOLD_ENV = "GRPO_SWEEPER_TEST_LEASE_HOLD"

_CREATE_LEASES = f"""CREATE TABLE IF NOT EXISTS {LEASE_TABLE} (
    name TEXT PRIMARY KEY, owner TEXT NOT NULL, pid INTEGER NOT NULL,
    renewed_at TIMESTAMPTZ NOT NULL, expires_at TIMESTAMPTZ NOT NULL, token BIGINT NOT NULL)"""
_TAKE = f"""INSERT INTO {LEASE_TABLE} AS l VALUES
    (:name, :owner, pg_backend_pid(), now(), now() + make_interval(secs => :ttl), 1)
ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, pid = excluded.pid,
    renewed_at = excluded.renewed_at, expires_at = excluded.expires_at, token = l.token + 1
WHERE l.owner = excluded.owner
   OR (l.renewed_at > pg_postmaster_start_time()
       AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.pid))
   OR (l.renewed_at <= pg_postmaster_start_time() AND l.expires_at < now())
RETURNING token"""
_RENEW = f"""UPDATE {LEASE_TABLE} SET pid = pg_backend_pid(), renewed_at = now(),
    expires_at = now() + make_interval(secs => :ttl) WHERE name = :name AND owner = :owner
RETURNING token"""
_RELEASE = f"DELETE FROM {LEASE_TABLE} WHERE name = :name AND owner = :owner"


_FENCE = f"""SELECT 1 FROM {LEASE_TABLE}
WHERE name = :name AND owner = :owner AND token = :token FOR SHARE"""


class LeaseLost(DatabaseUnreachable):
    """A write under a lease that another process has taken over since (this holder's
    session was seen ended: a partition, a restart): refused, and the worker leaves as it
    does when the database is gone; its trials go back through their heartbeats."""


class _Lease:
    """One lease held by this process: its own session, renewed by a thread until let go."""

    def __init__(self, url: str, name: str, store: str) -> None:
        self.url, self.name, self.store = url, name, store
        self.owner = f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.connection: Any = None
        self.token: int | None = None
        self.done = threading.Event()

    def _execute(self, sql: str) -> Any:
        import sqlalchemy

        if self.connection is None:
            self.connection = _lock_engine(self.url).connect()
        try:
            with self.connection.begin():
                result = self.connection.execute(
                    sqlalchemy.text(sql), {"name": self.name, "owner": self.owner, "ttl": LEASE_S}
                )
                return result.scalar() if result.returns_rows else None
        except Exception:
            with contextlib.suppress(Exception):
                self.connection.close()
            self.connection = None  # opened again on the next call (a restart dropped it)
            raise

    def take(self, window_s: float | None) -> int:
        """Wait for the lease; its fencing token (one more each time anyone takes it)."""
        hold = os.environ.get(LEASE_HOLD_ENV) if self.name == "schema" else None
        created_despite_others(
            lambda: retried(lambda: self._execute(_CREATE_LEASES), self.store, window_s), self.store
        )
        while True:
            token = retried(lambda: self._execute(_TAKE), self.store, window_s)
            if token is not None:
                self.token = token
                break
            if hold:
                with open(Path(hold, f"waited-{os.getpid()}"), "a") as f:
                    f.write("waited\n")
            time.sleep(LEASE_POLL_S)
        threading.Thread(target=self._renew, daemon=True).start()
        if hold:
            Path(hold, f"held-{os.getpid()}").touch()
            while not Path(hold, "go").exists():
                time.sleep(0.05)
        return self.token

    def _renew(self) -> None:
        while not self.done.wait(LEASE_S / 6):
            try:
                if self._execute(_RENEW) is None:
                    log.error("%s: lost the %s lease to another process", self.store, self.name)
                    return
            except Exception as e:  # the server is away: try again sooner
                if not is_unreachable(e):
                    log.warning(
                        "%s: renewing the %s lease: %s", self.store, self.name, first_line(e)
                    )

    def check(self, session: Any) -> None:
        """Inside a store's transaction about to commit a write: the lease is still this
        holder's, with the token it took (FOR SHARE: a takeover waits for this commit)."""
        import sqlalchemy

        params = {"name": self.name, "owner": self.owner, "token": self.token}
        if session.execute(sqlalchemy.text(_FENCE), params).first() is None:
            raise LeaseLost(
                f"{self.store}: the {self.name} lease (token {self.token}) was taken over by "
                "another process while this one held it (its session was seen ended); "
                "this write is refused"
            )

    def release(self) -> None:
        self.done.set()
        with contextlib.suppress(Exception):  # gone: it expires, or its session is seen ended
            retried(lambda: self._execute(_RELEASE), self.store, LEASE_S)
        with contextlib.suppress(Exception):
            if self.connection is not None:
                self.connection.close()


@contextlib.contextmanager
def lease(url: str, name: str, store: str, window_s: float | None = None) -> Iterator[int]:
    """Hold the PostgreSQL database's lease `name` for the block (yields its fencing token).
    Taking it is retried as `retried(..., window_s)` is; see the rules above."""
    held = _Lease(url, name, store)
    token = held.take(window_s)
    fenced = _held.set((*_held.get(), held))
    try:
        yield token
    finally:
        _held.reset(fenced)
        held.release()


# --- fencing: a write under a lease is refused once the lease was taken over ------------
# A holder cut off from the server (a partition, a pause) while another takes its lease over
# may wake and write: each commit that writes, made on the database of a lease this thread
# holds, first checks in its own transaction that the lease still carries this holder's
# token. Threads (the heartbeat's) start without the leases of the thread that made them.
_held: contextvars.ContextVar[tuple[_Lease, ...]] = contextvars.ContextVar("leases", default=())


def fence_writes(sessions: Any) -> None:
    """Fence every commit of `sessions` (a SQLAlchemy sessionmaker or scoped_session): one
    that writes while this thread holds a lease on the same database raises LeaseLost, its
    writes rolled back, when another process has taken that lease over."""
    from sqlalchemy import event

    key = "grpo_sweeper.fenced_write"  # its own key: other listeners may keep a "wrote"

    def wrote(session: Any, *_: Any) -> None:
        session.info[key] = True

    def statement(state: Any) -> None:  # an upsert Optuna runs as a statement, not a flush
        if state.is_insert or state.is_update or state.is_delete:
            wrote(state.session)

    def check(session: Any) -> None:
        writes = session.info.pop(key, False) or session.new or session.dirty
        if not (writes or session.deleted):
            return
        for held in _held.get():
            if _same_database(held.url, session.get_bind().url):
                held.check(session)

    event.listen(sessions, "after_flush", wrote)
    event.listen(sessions, "do_orm_execute", statement)
    event.listen(sessions, "before_commit", check)
    event.listen(sessions, "after_rollback", lambda session: session.info.pop(key, None))


def _same_database(a: Any, b: Any) -> bool:
    import sqlalchemy

    a, b = sqlalchemy.make_url(a), sqlalchemy.make_url(b)
    return (scheme(str(a)), a.host, a.port, a.database) == (
        scheme(str(b)),
        b.host,
        b.port,
        b.database,
    )


@contextlib.contextmanager
def schema_lock(
    url: str, store: str, sqlite_file: Path | None, window_s: float | None = None
) -> Iterator[None]:
    """One process at a time creates (or checks) a store's tables: workers started together
    on a fresh database otherwise race to create the same tables and types and the losers
    fail (a duplicate key in pg_type, "table already exists"). SQLite: a lock on the file's
    folder (the file may not exist yet); PostgreSQL: a lease; others: none."""
    _test_barrier(url)
    if sqlite_file is not None:
        folder = sqlite_file.expanduser().absolute().parent
        lock = flocked(folder) if folder.is_dir() else contextlib.nullcontext()
    elif scheme(url) == "postgresql":
        lock = lease(url, "schema", store, window_s)
    else:
        lock = contextlib.nullcontext()
    with lock:
        yield


def _test_barrier(url: str, timeout_s: float = 60) -> None:
    """Tests only (SCHEMA_BARRIER_ENV): wait until n processes reached this point for url."""
    spec = os.environ.get(SCHEMA_BARRIER_ENV)
    if not spec or multiprocessing.parent_process() is not None:  # a sweep's trial process:
        return  # its sweep met the barrier (and created the stores) before any job
    folder, parties = spec.rsplit(":", 1)
    tag = f"{zlib.crc32(url.encode()):08x}"
    Path(folder, f"{tag}-{os.getpid()}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(Path(folder).glob(f"{tag}-*"))) < int(parties):
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)
