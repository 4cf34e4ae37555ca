"""Databases that may blink: the driver a URL needs, retries while one is unreachable, and a
retry for tables another client is creating at the same moment. The leases that serialize
what several processes must not do at once (create a schema, change a plan) are
records/leases.py.

Shared by both stores a sweep writes: Optuna's storage (records/optuna_storage.py) and MLflow's
tracking store (records/tracking_store.py). A restart, a failover or a network blip drops every
connection; SQLAlchemy's pool_pre_ping replaces a dead pooled connection, and `retried`
waits out the seconds the server is away, for a bounded window, then says the database is
unreachable in one line.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from records.errors import first_line

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_RETRY_S = 120.0  # a plain run's window; a sweep passes its own (set_retry_window)
_retry_window = {"seconds": DEFAULT_RETRY_S}  # set once per process: set_retry_window
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)  # waits between tries; the last one repeats
# A SQLite file locked by another process is busy, not away: each try already waited the
# driver's busy timeout, so lock contention is retried this long at most, then raised as is.
LOCKED_WINDOW_S = 30.0
# A paused server (or a stalled network) makes calls wait rather than fail: a call this slow
# is taken as an outage, so others' heartbeats, as late as it was, are not read as deaths.
SLOW_CALL_S = 5.0
# The pip name of each driver a URL may need, and what the project installs it with.
DRIVER_PACKAGES = {"psycopg": "grpo-sweeper[postgres]"}


_last_failure = {"at": -math.inf}  # when a store call of this process last failed to connect


def note_store_failure() -> None:
    """A store call failed to reach its database (retried, or a heartbeat that failed)."""
    _last_failure["at"] = time.monotonic()


def note_if_slow(started: float) -> None:
    """A store call that began at `started` (time.monotonic) and returned: one slower than
    SLOW_CALL_S waited on a database that was away without failing (a paused server, a
    network stall), so the outage counts from its end, as a failed call's would."""
    if time.monotonic() - started > SLOW_CALL_S:
        note_store_failure()


def calm_for() -> float:
    """Seconds since a store call of this process last failed to reach its database: after an
    outage, others' heartbeats are as old as the outage, not a sign their workers died."""
    return time.monotonic() - _last_failure["at"]


class DatabaseUnreachable(Exception):
    """A store stayed unreachable for the whole retry window; the message names the store."""


def set_retry_window(seconds: float) -> None:
    """How long every store of this process is retried once unreachable (a sweep passes its
    setting to its jobs)."""
    _retry_window["seconds"] = float(seconds)


def retry_window() -> float:
    return _retry_window["seconds"]


def is_unreachable(error: BaseException) -> bool:
    """A dropped or refused connection, however wrapped: Optuna wraps the driver's error in a
    StorageInternalError, MLflow in an MlflowException (TEMPORARILY_UNAVAILABLE)."""
    return _connection_error(error) is not None


def _connection_error(error: BaseException) -> BaseException | None:
    """The connection error in error's chain (the wrappers' messages say less), or None."""
    import sqlalchemy.exc

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, DatabaseUnreachable):
            return None  # already retried for the whole window: never retry it again
        if isinstance(seen, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError):
            # A SQLite file has no server to come back: a file that cannot be opened (a
            # missing folder, no permission) stays so; its lock waits are the driver's timeout.
            return None if _sqlite_cannot_open(seen) else seen
        if isinstance(seen, sqlalchemy.exc.DBAPIError) and seen.connection_invalidated:
            return seen
        if isinstance(seen, ConnectionError):
            return seen
        if getattr(seen, "error_code", None) == "TEMPORARILY_UNAVAILABLE":
            return seen.__cause__ or seen
        seen = seen.__cause__ or seen.__context__
    return None


def _sqlite_cannot_open(error: BaseException) -> bool:
    return "unable to open database file" in str(getattr(error, "orig", error))


def retried(
    call: Callable[[], T],
    store: str,
    window_s: float | None = None,
    applied: Callable[[], tuple[bool, T]] | None = None,
) -> T:
    """call(), tried again with backoff while the database is unreachable, for window_s
    (default: the process's retry window); then DatabaseUnreachable naming the store. A
    locked SQLite file is retried for LOCKED_WINDOW_S at most, then its error raised.
    Each try is a store call (`store_call`): a signal landing in it is raised after it.

    A write whose commit reached the server may still fail (the reply was lost): before
    trying it again, applied() says whether its effect is already stored, and with what
    result; a write that is not naturally idempotent passes one."""
    window_s = retry_window() if window_s is None else window_s
    started = time.monotonic()
    for attempt in range(1_000_000):
        tried_at = time.monotonic()
        try:
            with store_call():
                if attempt and applied is not None:
                    done, result = applied()
                    if done:
                        return result
                result = call()
            note_if_slow(tried_at)
            return result
        except Exception as e:
            cause = _connection_error(e)
            if cause is None:
                raise
            note_store_failure()
            why = first_line(cause)[:200]
            waited = time.monotonic() - started
            if _sqlite_locked(cause):
                if waited >= min(window_s, LOCKED_WINDOW_S):
                    raise
            elif waited >= window_s:
                raise DatabaseUnreachable(
                    f"{store}: the database is unreachable (retried for {window_s:g} s: {why})"
                ) from e
            if attempt == 0:
                log.warning("%s: lost the database (%s); retrying", store, why)
            time.sleep(min(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)], window_s / 4 + 0.05))
    raise AssertionError("unreachable")


def _sqlite_locked(error: BaseException) -> bool:
    return "database is locked" in str(getattr(error, "orig", error))


# --- signals inside store calls ------------------------------------------------------
# A signal whose handler raises (SIGTERM as an interrupt) lands between any two bytecodes: in
# a store call, it would leave the driver's session open mid-transaction (SQLite: its write
# lock held), and the handler's own writes would then wait on this very process. Inside a
# store call on the main thread (where Python runs signal handlers) the interrupt is kept
# and raised when the call returns, its session committed or rolled back and closed.


class _StoreCalls:
    depth = 0  # store calls of the main thread in progress (nested ones count)
    pending: BaseException | None = None  # an interrupt kept until they return


@contextlib.contextmanager
def store_call() -> Iterator[None]:
    """A block that talks to a store: an interrupt deferred within it (`defer_interrupt`) is
    raised when the outermost block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _StoreCalls.depth += 1
    try:
        yield
    finally:
        _StoreCalls.depth -= 1
        if _StoreCalls.depth == 0 and _StoreCalls.pending is not None:
            interrupt, _StoreCalls.pending = _StoreCalls.pending, None
            raise interrupt


def defer_interrupt(interrupt: BaseException) -> bool:
    """For a signal handler: True when a store call is in progress, which raises `interrupt`
    as it returns; False when the handler should raise it now."""
    if _StoreCalls.depth == 0:
        return False
    if _StoreCalls.pending is None:
        _StoreCalls.pending = interrupt
    return True


def retrying(method: Callable[..., T], store_of: Callable[[Any], str]) -> Callable[..., T]:
    """A method whose every call is `retried`; store_of(self) names the store in messages.
    How ResilientRDBStorage and ResilientMlflowClient wrap their libraries' classes."""

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> T:
        return retried(lambda: method(self, *args, **kwargs), store_of(self))

    return call


def shown_url(url: str) -> str:
    """A URL as messages show it: any password masked."""
    import sqlalchemy

    try:
        return sqlalchemy.make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a database URL at all: the caller's check says so
        return url


def missing_driver(url: str) -> str | None:
    """What to install when the URL's driver is missing (None when it imports), e.g.
    `postgresql://` needs psycopg (SQLAlchemy 2's default for PostgreSQL)."""
    import sqlalchemy

    try:
        sqlalchemy.make_url(url).get_dialect().import_dbapi()
    except ImportError as e:
        module = (e.name or "").split(".")[0] or first_line(e)
        package = DRIVER_PACKAGES.get(module, module)
        return f"needs the {module} driver, which is not installed (pip install '{package}')"
    except Exception:  # an unknown dialect or a malformed URL: opening it says what is wrong
        return None
    return None


def scheme(url: str) -> str:
    """The database in a URL: postgresql for postgresql+psycopg://..."""
    return url.split(":", 1)[0].split("+", 1)[0]


SQLITE_PREFIX = "sqlite:///"


def sqlite_path(url: str) -> Path | None:
    """The file behind a SQLite URL (None for any other database, and for SQLite in memory)."""
    if url.startswith(SQLITE_PREFIX) and url != "sqlite:///:memory:":
        return Path(url[len(SQLITE_PREFIX) :]).expanduser()
    return None


def absolute_url(url: str) -> str:
    """`sqlite:///sweeps.db` -> `sqlite:////abs/path/sweeps.db`: the same file from any dir."""
    path = sqlite_path(url)
    return url if path is None else SQLITE_PREFIX + str(path.absolute())


# --- schemas created by others at the same moment ---------------------------------------
# Another client (an `mlflow server`, a notebook, optuna-dashboard) creating the same fresh
# database's tables does not take our lock: its CREATE TABLE and ours race, and the loser
# fails (a duplicate key in pg_type, "already exists"), or finds the tables made but not yet
# migrated, or (SQLite, where DDL is not transactional) its alembic version moved on between
# our read of it and our write ("expected to match one row"). Creation is then tried again,
# for this long at most, once the other is done.
SCHEMA_RACE_WINDOW_S = 60.0
# SQLSTATEs of a creation that lost a race: unique_violation (pg_type_typname_nsp_index),
# duplicate_table, duplicate_object, duplicate_column.
_RACE_STATES = {"23505", "42P07", "42710", "42701"}
_RACE_WORDS = (
    "already exists",
    "duplicate column",
    "out-of-date database schema",
    "online migration expected to match one row",
)


def lost_schema_race(error: BaseException) -> bool:
    """An error of creating a store's tables while another client created them."""
    seen: BaseException | None = error
    while seen is not None:
        if getattr(getattr(seen, "orig", None), "sqlstate", None) in _RACE_STATES:
            return True
        if getattr(seen, "sqlstate", None) in _RACE_STATES:
            return True
        if any(word in str(seen).lower() for word in _RACE_WORDS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def created_despite_others(create: Callable[[], T], store: str) -> T:
    """create() (a store's tables, made or checked), tried again while it lost a race with
    another client creating the same tables (`lost_schema_race`), for SCHEMA_RACE_WINDOW_S."""
    started = time.monotonic()
    for attempt in range(1_000_000):
        try:
            return create()
        except Exception as e:
            if not lost_schema_race(e) or time.monotonic() - started > SCHEMA_RACE_WINDOW_S:
                raise
            if attempt == 0:
                log.warning(
                    "%s: another client is creating it (%s); retrying", store, first_line(e)[:200]
                )
            time.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
    raise AssertionError("unreachable")
