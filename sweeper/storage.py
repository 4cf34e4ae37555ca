"""Where a study lives: the storage URL, opening it safely, heartbeats and stale trials.

Only RDB storages (SQLite, PostgreSQL, MySQL) are accepted: they are the ones Optuna gives
heartbeats, and heartbeats are how a restarted sweep tells a trial whose process died
(kill -9, a lost host) from one another worker is still running.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator

import optuna
import sqlalchemy
import sqlalchemy.pool
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial

from sweeper import optuna_adapter as oa
from sweeper.errors import SweepError
from sweeper.records import TrialAttr, absolute_url, sqlite_path
from sweeper.text import first_line
from trainer.locks import flocked

RDB_SCHEMES = ("sqlite", "postgresql", "mysql")
SQLITE_TIMEOUT_S = 60  # several processes write one SQLite file: wait for the lock
SCHEMA_RACE_RETRIES = 5
PLAN_LOCK = {"key": zlib.crc32(b"grpo-sweeper plan")}  # one advisory lock per database


def resolve_url(url: str) -> str:
    """An absolute URL, so jobs started in another directory reach the same file."""
    if "://" not in url or _scheme(url) not in RDB_SCHEMES:
        raise SweepError(
            f"hydra.sweeper.storage={url!r}: not a database URL; use e.g. sqlite:///sweeps.db "
            "or postgresql://user@host/db"
        )
    return absolute_url(url)


def _scheme(url: str) -> str:
    """The database in a URL: postgresql for postgresql+psycopg2://..."""
    return url.split(":", 1)[0].split("+", 1)[0]


def open_storage(
    url: str, heartbeat_interval: int | None = None, grace_period: int | None = None
) -> RDBStorage:
    """Open (and, the first time, create) the storage; any failure is one line naming the URL.

    Workers started together on a fresh database race to create Optuna's tables. On SQLite
    one process at a time opens it (a lock on its folder); a server's losers see a
    duplicate-key error and succeed once the winner is done.
    """
    path = sqlite_path(url)
    kwargs = {"connect_args": {"timeout": SQLITE_TIMEOUT_S}} if path else {}
    for attempt in range(SCHEMA_RACE_RETRIES + 1):
        try:
            with _creation_lock(path), warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(
                    url,
                    engine_kwargs=kwargs,
                    heartbeat_interval=heartbeat_interval,
                    grace_period=grace_period,
                )
        except Exception as e:  # sqlalchemy, driver and OS errors alike: say which URL failed
            racing = any(s in str(e) for s in ("duplicate key", "already exists", "UNIQUE"))
            if racing and attempt < SCHEMA_RACE_RETRIES:
                time.sleep(0.5 * (attempt + 1))
                continue
            raise SweepError(
                f"hydra.sweeper.storage={url!r}: cannot open it ({first_line(e)})"
            ) from None
    raise AssertionError("unreachable")


def _creation_lock(path) -> contextlib.AbstractContextManager:
    if path is None or not path.absolute().parent.is_dir():
        return contextlib.nullcontext()  # a server, or a folder that does not exist: fails below
    return flocked(path.absolute().parent)


@contextlib.contextmanager
def exclusive(url: str) -> Iterator[None]:
    """Hold off other processes while this one changes the plan: takes a queued slot, queues
    the missing ones, or fails an interrupted trial and queues its point again. Without it, a
    worker joining between another's fail and re-queue sees the point missing and queues it
    too, and the point runs twice.

    SQLite: an flock on the database file (SQLite ignores FOR UPDATE, and its own locks are
    per write). PostgreSQL: a session advisory lock. Both are let go when the process dies
    (the kernel closes the file, the server ends the session), so a kill -9 never leaves one
    held. MySQL: no plan-wide lock; taking a slot is still exclusive through the row lock
    Optuna takes (SELECT ... FOR UPDATE) when it moves the trial WAITING -> RUNNING.
    """
    path = sqlite_path(url)
    if path is not None:
        with flocked(path):
            yield
    elif _scheme(url) == "postgresql":
        with _lock_engine(url).connect() as connection:
            connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), PLAN_LOCK)
            try:
                yield
            finally:
                connection.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), PLAN_LOCK)
    else:
        yield


@functools.cache
def _lock_engine(url: str) -> sqlalchemy.Engine:
    # No pool: the lock lives exactly as long as the connection that holds it.
    return sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)


def fail_stale_trials(study: optuna.Study, reason: str) -> list[FrozenTrial]:
    """Fail RUNNING trials whose heartbeat stopped; return the ones this process failed.

    Like `optuna.storages.fail_stale_trials`, but the reason is written first (a finished
    trial's attrs are read-only), and exactly one racing worker wins each trial.
    """
    failed = []
    for trial_id in oa.stale_trial_ids(study):
        try:
            oa.set_attr(study, trial_id, TrialAttr.FAIL_REASON, reason)
            oa.set_attr(study, trial_id, TrialAttr.INTERRUPTED, True)
            oa.fail(study, trial_id)
        except UpdateFinishedTrialError:  # another worker (or the trial itself) got there first
            continue
        failed.append(oa.fresh(study, trial_id))
    return failed


class Heartbeat:
    """Records a heartbeat for each trial in flight, from the sweeper's process.

    The sweeper outlives every trial it launched (it waits for the launcher), so its
    heartbeat stops exactly when nothing will tell the study how those trials ended.
    `in_flight` is asked at every beat: trials start and end while it runs.
    """

    def __init__(self, study: optuna.Study, in_flight: Callable[[], Iterable[int]]) -> None:
        self.study = study
        self.in_flight = in_flight
        self.interval = oa.storage_of(study).get_heartbeat_interval()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="optuna-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        if self.interval is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def beat(self, trial_ids: Iterable[int]) -> None:
        """At once, e.g. when a trial starts: a trial with no heartbeat is never found stale."""
        if self.interval is not None:
            for trial_id in trial_ids:
                oa.record_heartbeat(self.study, trial_id)

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat(list(self.in_flight()))
            except Exception:  # a busy database skips one beat; the next one retries
                continue


def wait_for(predicate: Callable[[], bool], poll_s: float, timeout_s: float) -> bool:
    """Poll until predicate() holds or timeout_s passes; True if it held."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True
