"""A SQLite store's tables made in one transaction, and a store that another client is making,
or left half-made, told apart from a whole one.

MLflow and Optuna make a store's tables on first use, one statement after another, each
committed as it runs (Python's sqlite3 opens no transaction for CREATE or ALTER). Another
client of the same file (`mlflow ui`, a notebook polling mlflow.search_runs, optuna.load_study)
does the same at the same moment and takes no lock of ours: the two interleave, and one
adds a column the other just added, or migrates from a version the other has moved past.

So a store with no tables is made here in one transaction that holds SQLite's own write lock
(BEGIN EXCLUSIVE) from its first table to its last, by the library's own creation code run on
that one connection: another client reads no tables or all of them, and a crash (kill -9)
leaves no tables, SQLite rolling the rest back. A store found part-made is another client's
work in progress: it is waited on while it changes. Once it has not changed for QUIET_S, its
maker has stopped: it is completed in one transaction, as the library completes an older
store, or refused in one line (the attempt rolled back, the file as it was).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import sqlalchemy
import sqlalchemy.pool

from records.database import SQLITE_PREFIX
from records.errors import StoreUnusable, first_line

log = logging.getLogger(__name__)

# A part-made store unchanged this long is taken as left by a client that stopped: a live
# one runs its next statement within milliseconds, or seconds on a starved CPU.
QUIET_S = 30.0
# How long a store another client keeps changing is waited on (`mlflow db upgrade` of a
# large store takes minutes).
CHANGING_WINDOW_S = 600.0
POLL_S = 0.2
LOCK_TIMEOUT_S = 60  # how long a reader or our transaction waits for another's write lock


@dataclass(frozen=True)
class Schema:
    """One library's store: when it is whole, how the library makes it, and what a person
    does with one that cannot be completed."""

    whole: Callable[[sqlalchemy.Engine], bool]
    # make or complete it as the library does, on engines built with these engine kwargs
    build: Callable[[str, dict[str, Any]], None]
    advice: str  # what to do, said after why it cannot be completed


class _State(NamedTuple):
    """What a store's file holds, to tell whether another client is still changing it."""

    schema_cookie: int  # SQLite counts every change of its tables in the file's header
    tables: frozenset[str]
    revisions: tuple[str, ...]  # alembic_version's rows (both libraries migrate with alembic)


def made_whole(path: Path, store: str, schema: Schema) -> None:
    """Return once the SQLite store at path is whole (see the module's docstring); a store
    left part-made that cannot be completed, or one still changing after
    CHANGING_WINDOW_S, raises StoreUnusable naming the file and what to do."""
    url = SQLITE_PREFIX + str(path.absolute())
    seen, changed_at = None, time.monotonic()
    deadline = time.monotonic() + CHANGING_WINDOW_S
    while True:
        with _engine(url) as reader:
            if _is_whole(schema, reader):
                return
            state = _read_state(reader)
        if state.tables and seen is None:
            log.warning(
                "%s: another client may be creating or upgrading it; waiting until it is whole",
                store,
            )
        if state != seen:
            seen, changed_at = state, time.monotonic()
        if not state.tables or time.monotonic() - changed_at >= QUIET_S:
            with _exclusive(path, store) as kwargs, _engine(url, kwargs) as held:
                if _is_whole(schema, held):  # its maker finished while we took the lock
                    return
                if _read_state(held) == seen:  # nobody changed it since: ours to make
                    _build(path, store, schema, url, kwargs, held)
                    return
        elif time.monotonic() > deadline:
            raise StoreUnusable(
                f"{store}: {path} is still being changed by another client after "
                f"{CHANGING_WINDOW_S:g} s; try again once it has finished"
            )
        time.sleep(POLL_S)


def _is_whole(schema: Schema, engine: sqlalchemy.Engine) -> bool:
    try:
        return schema.whole(engine)
    except Exception:  # e.g. two alembic versions: a store half-made by two clients at once
        return False


def _build(
    path: Path,
    store: str,
    schema: Schema,
    url: str,
    engine_kwargs: dict[str, Any],
    held: sqlalchemy.Engine,
) -> None:
    """Make or complete the store inside the held transaction, or refuse it in one line."""
    try:
        schema.build(url, engine_kwargs)
        if _is_whole(schema, held):
            return
        why = "its tables are still not all there"
    except Exception as e:  # the library's own error, e.g. a column a dead client added
        why = first_line(e)[:300]
    raise StoreUnusable(f"{store}: {path} cannot be completed ({why}); {schema.advice}")


@contextlib.contextmanager
def _engine(url: str, engine_kwargs: dict[str, Any] | None = None) -> Iterator[Any]:
    kwargs = engine_kwargs or {
        "poolclass": sqlalchemy.pool.NullPool,
        "connect_args": {"timeout": LOCK_TIMEOUT_S},
    }
    engine = sqlalchemy.create_engine(url, **kwargs)
    try:
        yield engine
    finally:
        engine.dispose()


def _read_state(engine: sqlalchemy.Engine) -> _State:
    with engine.connect() as connection:
        cookie = connection.exec_driver_sql("PRAGMA schema_version").scalar()
        tables = frozenset(sqlalchemy.inspect(connection).get_table_names())
        revisions = ()
        if "alembic_version" in tables:
            rows = connection.exec_driver_sql("SELECT version_num FROM alembic_version")
            revisions = tuple(sorted(row[0] for row in rows))
    return _State(cookie, tables, revisions)


class _Held:
    """The one connection of the exclusive transaction, as every engine built on it sees it:
    the libraries' commits and rollbacks are left to the transaction's holder."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    def commit(self) -> None:
        pass

    def rollback(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)


@contextlib.contextmanager
def _exclusive(path: Path, store: str) -> Iterator[dict[str, Any]]:
    """Engine kwargs whose engines all run on one connection, in one BEGIN EXCLUSIVE
    transaction: committed when the block ends, rolled back when it raises."""
    # isolation_level=None: the driver issues no BEGIN or COMMIT of its own
    connection = sqlite3.connect(
        path, timeout=LOCK_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    try:
        try:
            connection.execute("BEGIN EXCLUSIVE")
        except sqlite3.OperationalError as e:
            raise StoreUnusable(
                f"{store}: {path} stayed locked by another client for {LOCK_TIMEOUT_S} s ({e})"
            ) from None
        held = _Held(connection)
        yield {"creator": lambda: held, "poolclass": sqlalchemy.pool.StaticPool}
        connection.execute("COMMIT")
    finally:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        connection.close()
