"""The MLflow tracking store, as every process of the project opens it: checked in one line
before any run starts (`check_tracking_uri`), a database store created under the schema lock,
and a client whose every call waits out an unreachable database (`tracking_client`). What is
written through it is written by records/tracking.py.
"""

from __future__ import annotations

import functools
import inspect
import os
import urllib.request
import uuid
from typing import Any
from urllib.parse import urlparse

import mlflow
from mlflow.tracking import MlflowClient

from records.database import (
    DatabaseUnreachable,
    created_despite_others,
    missing_driver,
    retried,
    retrying,
    scheme,
    shown_url,
    sqlite_path,
)
from records.errors import StoreUnusable, first_line
from records.leases import schema_lock
from records.sqlite_schema import Schema, made_whole


def check_tracking_uri(uri: str | None = None) -> str:
    """Fail in one line, before any run starts, when the tracking store cannot be used.

    A server is probed with a 5 s timeout, a database with one connection, instead of
    MLflow's own retries (minutes): a store that does not answer now is a setting to fix.
    """
    uri = uri or mlflow.get_tracking_uri()
    scheme = urlparse(uri).scheme
    file = sqlite_path(uri)
    if file is not None:  # a local file: check where it goes, without creating it yet
        folder = file.absolute().parent
        if not (folder.is_dir() and os.access(folder, os.W_OK)):
            raise StoreUnusable(f"MLFLOW_TRACKING_URI={uri!r}: cannot write in {str(folder)!r}")
        return uri
    missing = missing_driver(uri) if _is_database(uri) else None
    if missing:
        raise StoreUnusable(f"{_store(uri)}: {missing}")
    try:
        if scheme in ("http", "https"):
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5).close()
        elif _is_database(uri):
            _database_client(uri, window_s=0)
        else:
            MlflowClient(uri).search_experiments(max_results=1)
    except Exception as e:  # any failure here means no run could be logged
        cause = e.__cause__ if isinstance(e, DatabaseUnreachable) else e
        reason = first_line(getattr(cause, "reason", None) or cause)[:200]
        raise StoreUnusable(f"{_store(uri)}: cannot use this tracking store ({reason})") from None
    return uri


def tracking_client(uri: str | None = None) -> MlflowClient:
    """The client of `uri`, else of the tracking URI in effect now (one client per URI)."""
    return _client(uri or mlflow.get_tracking_uri())


@functools.cache  # keyed by the URI itself: one resolved at the call, never a stale default
def _client(uri: str) -> MlflowClient:
    """A client whose store exists, and which outlasts a database restart.

    A database store (SQLite, PostgreSQL, MySQL) is created and migrated by MLflow on first
    use; processes doing it at once fail ("duplicate column", a duplicate key in pg_type),
    and workers of a sweep start together, so creation happens under the schema lock. Every
    call is retried while the database is unreachable (records/database.py). An HTTP tracking
    server is left to MLflow's own retries (MLFLOW_HTTP_REQUEST_MAX_RETRIES).
    """
    if not _is_database(uri):
        return MlflowClient(uri)
    return _database_client(uri, window_s=None)


class ResilientMlflowClient(MlflowClient):
    """An MlflowClient whose calls wait out an unreachable database (see tracking_client)."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.store = _store(uri)


for _name, _method in list(vars(MlflowClient).items()):
    if not _name.startswith("_") and inspect.isfunction(_method):
        setattr(ResilientMlflowClient, _name, retrying(_method, lambda self: self.store))

# A run carries this tag: a creation retried after its reply was lost finds the run it made
# instead of starting a second one. (Bookkeeping, as tracking.py's EXPERIMENT_KIND: no record.)
WRITE_KEY_TAG = "grpo_sweeper.write_key"


def _create_run(
    self: ResilientMlflowClient,
    experiment_id: str,
    start_time: int | None = None,
    tags: dict[str, Any] | None = None,
    run_name: str | None = None,
) -> Any:
    key = uuid.uuid4().hex
    tags = {**(tags or {}), WRITE_KEY_TAG: key}

    def applied() -> tuple[bool, Any]:
        found = MlflowClient.search_runs(
            self, [experiment_id], filter_string=f"tags.`{WRITE_KEY_TAG}` = '{key}'"
        )
        return bool(found), found[0] if found else None

    return retried(
        lambda: MlflowClient.create_run(self, experiment_id, start_time, tags, run_name),
        self.store,
        applied=applied,
    )


ResilientMlflowClient.create_run = _create_run


def _database_client(uri: str, window_s: float | None) -> ResilientMlflowClient:
    """Open (the first time: create) a database store; window_s=0 fails at once."""
    sqlite_file = sqlite_path(uri)

    def create() -> ResilientMlflowClient:
        if sqlite_file is None:  # fail fast where MLflow would retry its engine for minutes
            _probe(uri)
        with schema_lock(uri, _store(uri), sqlite_file, window_s):
            if sqlite_file is not None:  # made in one transaction, or another client's waited on
                made_whole(sqlite_file, _store(uri), mlflow_schema(uri))
            return created_despite_others(lambda: _created_client(uri), _store(uri))

    return retried(create, _store(uri), window_s)


def _created_client(uri: str) -> ResilientMlflowClient:
    """A client of a store that exists: MLflow creates and migrates it on first use. Another
    client (an `mlflow server`, a notebook) creating it at the same moment makes this fail,
    and `created_despite_others` tries again."""
    client = ResilientMlflowClient(uri)
    MlflowClient.search_experiments(client, max_results=1)  # the store is created here
    return client


def mlflow_schema(uri: str) -> Schema:
    """An MLflow store as records/sqlite_schema.py makes it whole: what MLflow's own
    SqlAlchemyStore does on first use (MLflow keeps these helpers private)."""
    from mlflow.store.db import utils

    def whole(engine: Any) -> bool:
        head = utils._get_latest_schema_revision()
        return utils._all_tables_exist(engine) and utils._get_schema_version(engine) == head

    def build(url: str, engine_kwargs: dict[str, Any]) -> None:
        import sqlalchemy

        engine = sqlalchemy.create_engine(url, **engine_kwargs)
        if not utils._all_tables_exist(engine):  # new, half-made or older: create and migrate
            utils._initialize_tables(engine)
        utils._verify_schema(engine)  # tables all there but older: MLflow says to upgrade

    advice = (
        "a client that was creating or upgrading it stopped midway, or an older MLflow made "
        f"it: back it up and run `mlflow db upgrade {uri}`, or delete it if it holds no runs"
    )
    return Schema(whole, build, advice)


def _probe(uri: str) -> None:
    import sqlalchemy
    import sqlalchemy.pool

    engine = sqlalchemy.create_engine(uri, poolclass=sqlalchemy.pool.NullPool)
    try:
        engine.connect().close()
    finally:
        engine.dispose()


def _is_database(uri: str) -> bool:
    return scheme(uri) in ("sqlite", "postgresql", "mysql")


def _store(uri: str) -> str:
    """How messages name the tracking store."""
    return f"MLFLOW_TRACKING_URI={shown_url(uri)!r}"
