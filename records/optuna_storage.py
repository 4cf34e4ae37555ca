"""Where a study lives: Optuna's RDB storage opened safely and every call retried while the
database is unreachable (records/database.py), writes whose reply was lost found again instead of
made twice, and the plan's lock. The sweep writes through it, the analysis reads through it: a
report on a busy or restarting store waits as a trial does.

Only RDB storages (SQLite, PostgreSQL, MySQL) are accepted: they are the ones Optuna gives
heartbeats, and heartbeats are how a restarted sweep tells a trial whose process died
(kill -9, a lost host) from one another worker is still running (sweeper/study/heartbeat.py).
"""

from __future__ import annotations

import contextlib
import copy
import uuid
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import optuna
from optuna.storages import BaseStorage, RDBStorage
from optuna.trial import FrozenTrial, TrialState

from records.database import (
    DatabaseUnreachable,
    created_despite_others,
    retried,
    retrying,
    scheme,
    shown_url,
    sqlite_path,
)
from records.errors import StoreUnusable, first_line
from records.leases import fence_writes, lease, schema_lock
from records.locks import flocked
from records.sqlite_schema import Schema, made_whole

SQLITE_TIMEOUT_S = 60  # several processes write one SQLite file: wait for the lock
CONNECT_TIMEOUT_S = 10  # a server that does not answer is retried, not waited on forever


# A template trial (a queued slot) carries this key: a creation retried after its reply was
# lost finds the trial it already made instead of queueing the slot twice.
WRITE_KEY = "grpo_sweeper_write_key"


class ResilientRDBStorage(RDBStorage):
    """Optuna's RDB storage, each call retried while the database is unreachable; `store`
    names it in messages. The two writes below also find their own commit when its reply was
    lost, so a retry never makes it twice."""

    def __init__(self, url: str, *args: Any, store: str | None = None, **kwargs: Any) -> None:
        self.store = store or f"the Optuna storage {shown_url(url)!r}"
        super().__init__(url, *args, **kwargs)
        fence_writes(self.scoped_session)  # a write under a lease taken over is refused

    def __setstate__(self, state: dict[Any, Any]) -> None:  # a copy sent to another process
        super().__setstate__(state)
        fence_writes(self.scoped_session)

    def _create_new_trial(
        self, study_id: int, template_trial: FrozenTrial | None = None
    ) -> FrozenTrial:
        if template_trial is not None:
            key = uuid.uuid4().hex
            template_trial = copy.copy(template_trial)
            template_trial.system_attrs = {**template_trial.system_attrs, WRITE_KEY: key}

        def applied() -> tuple[bool, FrozenTrial | None]:
            if template_trial is None:
                return False, None
            made = [
                t
                for t in RDBStorage.get_all_trials(self, study_id, deepcopy=False)
                if t.system_attrs.get(WRITE_KEY) == key
            ]
            return bool(made), made[0] if made else None

        return retried(
            lambda: RDBStorage._create_new_trial(self, study_id, template_trial),
            self.store,
            applied=applied,
        )

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        """A state already stored as asked (with the same values) was this call's own commit:
        a claim (WAITING -> RUNNING) is made under the plan's lock, a tell by the trial's
        owner."""

        def applied() -> tuple[bool, bool]:
            trial = RDBStorage.get_trial(self, trial_id)
            same = trial.state == state and (
                values is None or list(trial.values or []) == list(values)
            )
            return same, True

        return retried(
            lambda: RDBStorage.set_trial_state_values(self, trial_id, state, values),
            self.store,
            applied=applied,
        )


# Every other call that reaches the database, retried as it is: BaseStorage's API, the
# heartbeats, and the private methods Optuna's _CachedStorage (which load_study puts in front
# of an RDB storage) calls on its backend directly.
for _name in [n for n in vars(BaseStorage) if not n.startswith("_")] + [
    "record_heartbeat",
    "_get_stale_trial_ids",
    "_create_new_trial",
    "_set_trial_param",
    "_get_best_trial_id",
    "_get_trials",
]:
    if callable(getattr(RDBStorage, _name)) and _name not in vars(ResilientRDBStorage):
        method = getattr(RDBStorage, _name)
        setattr(ResilientRDBStorage, _name, retrying(method, lambda self: self.store))


def store_name(url: str) -> str:
    """How messages name the study's store."""
    return f"hydra.sweeper.storage={shown_url(url)!r}"


def open_storage(
    url: str,
    heartbeat_interval: int | None = None,
    grace_period: int | None = None,
    patient: bool = True,
) -> RDBStorage:
    """Open (and, the first time, create) the storage; any failure is one line naming the URL.

    patient=False: a database that cannot be reached now fails at once, as bad input does
    (the sweep's first contact). Jobs are patient: the sweep reached it a moment ago.
    Workers started together on a fresh database would race to create Optuna's tables: one
    at a time creates or checks them (records.leases.schema_lock).
    """
    path = sqlite_path(url)
    if path:
        kwargs = {"connect_args": {"timeout": SQLITE_TIMEOUT_S}}
    else:
        kwargs = {"pool_pre_ping": True}  # a pooled connection the server dropped is replaced
        if scheme(url) == "postgresql":
            kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}

    window_s = None if patient else 0

    def create() -> RDBStorage:
        with schema_lock(url, store_name(url), path, window_s), warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            if path is not None:  # made in one transaction, or another client's waited on
                made_whole(path, store_name(url), optuna_schema(url))
            return created_despite_others(  # optuna-dashboard may be creating it too
                lambda: ResilientRDBStorage(
                    url,
                    store=store_name(url),
                    engine_kwargs=kwargs,
                    heartbeat_interval=heartbeat_interval,
                    grace_period=grace_period,
                ),
                store_name(url),
            )

    try:
        return retried(create, store_name(url), window_s)
    except StoreUnusable:
        raise
    except DatabaseUnreachable as e:
        if patient:
            raise
        reason = first_line(e.__cause__)
    except Exception as e:  # sqlalchemy, driver and OS errors alike: say which URL failed
        reason = first_line(e)
    raise StoreUnusable(f"{store_name(url)}: cannot open it ({reason})") from None


def optuna_schema(url: str) -> Schema:
    """An Optuna storage as records/sqlite_schema.py makes it whole: its tables, its version
    row and its alembic revision, made by RDBStorage itself (which also completes a store
    whose maker stopped before the last two)."""
    from optuna.storages._rdb import models

    def whole(engine: Any) -> bool:
        import sqlalchemy

        tables = set(sqlalchemy.inspect(engine).get_table_names())
        if not {*models.BaseModel.metadata.tables, "alembic_version"} <= tables:
            return False
        with engine.connect() as connection:  # one version row, one alembic revision
            rows = [
                connection.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar()
                for table in ("version_info", "alembic_version")
            ]
        return rows == [1, 1]

    def build(url: str, engine_kwargs: dict[str, Any]) -> None:
        RDBStorage(url, engine_kwargs=engine_kwargs).engine.dispose()

    advice = (
        "a client that was creating it stopped midway, or another Optuna made it: back it up "
        f"and run `optuna storage upgrade --storage {url}`, or delete it if it holds no study"
    )
    return Schema(whole, build, advice)


@contextlib.contextmanager
def exclusive(url: str) -> Iterator[None]:
    """Hold off other processes while this one changes the plan: takes a queued slot, queues
    the missing ones, or fails an interrupted trial and queues its point again. Without it, a
    worker joining between another's fail and re-queue sees the point missing and queues it
    too, and the point runs twice.

    SQLite: an flock on the database file (SQLite ignores FOR UPDATE, and its own locks are
    per write). PostgreSQL: a lease row (records.leases.lease), which a server restart
    does not drop. Both are let go when the process dies (the kernel closes the file; the
    server sees the lease's session end), so a kill -9 never leaves one held. MySQL: no plan-wide lock; taking a slot is still exclusive through the row lock
    Optuna takes (SELECT ... FOR UPDATE) when it moves the trial WAITING -> RUNNING.
    """
    path = sqlite_path(url)
    if path is not None:
        with flocked(path):
            yield
    elif scheme(url) == "postgresql":
        with lease(url, "plan", store_name(url)):
            yield
    else:
        yield
