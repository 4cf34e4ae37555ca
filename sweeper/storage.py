"""Where a study lives: the storage URL, joining a study, heartbeats and stale trials.

Only RDB storages (SQLite, PostgreSQL, MySQL) are accepted: they are the ones Optuna gives
heartbeats, and heartbeats are how a restarted sweep tells a trial whose process died
(kill -9, a lost host) from one another worker is still running.
"""

from __future__ import annotations

import contextlib
import fcntl
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

from sweeper.errors import SweepError

RDB_SCHEMES = ("sqlite", "postgresql", "mysql")
SQLITE_TIMEOUT_S = 60  # several processes write one SQLite file: wait for the lock
SCHEMA_RACE_RETRIES = 5


def resolve_url(url: str) -> str:
    """An absolute URL, so jobs started in another directory reach the same file."""
    scheme = url.split(":", 1)[0].split("+", 1)[0]
    if "://" not in url or scheme not in RDB_SCHEMES:
        raise SweepError(
            f"hydra.sweeper.storage={url!r}: not a database URL; use e.g. sqlite:///sweeps.db "
            "or postgresql://user@host/db"
        )
    prefix = "sqlite:///"
    if url.startswith(prefix) and url != "sqlite:///:memory:":
        path = url[len(prefix) :]
        return prefix + str(Path(path).expanduser().absolute())
    return url


def open_storage(
    url: str, heartbeat_interval: int | None = None, grace_period: int | None = None
) -> RDBStorage:
    """Open (and for SQLite create) the storage; any failure is one line naming the URL."""
    kwargs = {"connect_args": {"timeout": SQLITE_TIMEOUT_S}} if url.startswith("sqlite") else {}
    for attempt in range(SCHEMA_RACE_RETRIES + 1):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(
                    url,
                    engine_kwargs=kwargs,
                    heartbeat_interval=heartbeat_interval,
                    grace_period=grace_period,
                )
        except Exception as e:  # sqlalchemy, driver and OS errors alike: say which URL failed
            # Workers opening a fresh database together race to create Optuna's tables;
            # the losers see a duplicate-key error and succeed once the winner is done.
            racing = "duplicate key" in str(e) or "already exists" in str(e)
            if racing and attempt < SCHEMA_RACE_RETRIES:
                time.sleep(0.5 * (attempt + 1))
                continue
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SweepError(f"hydra.sweeper.storage={url!r}: cannot open it ({reason})") from None
    raise AssertionError("unreachable")


@contextlib.contextmanager
def exclusive(url: str) -> Iterator[None]:
    """Hold off other processes while one takes a queued trial.

    PostgreSQL and MySQL lock the trial's row (SELECT ... FOR UPDATE) when Optuna moves it
    WAITING -> RUNNING, so only one worker wins. SQLite ignores FOR UPDATE and two workers
    can both win; for SQLite (one machine by nature) we take an flock on the database file,
    which Linux keeps apart from the fcntl byte-range locks SQLite itself uses.
    """
    if not url.startswith("sqlite:///") or url == "sqlite:///:memory:":
        yield
        return
    with open(url[len("sqlite:///") :], "rb") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def fail_stale_trials(study: optuna.Study, reason: str) -> list[FrozenTrial]:
    """Fail RUNNING trials whose heartbeat stopped; return the ones this process failed.

    Like `optuna.storages.fail_stale_trials`, but the reason is written first (a finished
    trial's attrs are read-only), and exactly one racing worker wins each trial.
    """
    storage = study._storage
    if storage.get_heartbeat_interval() is None:
        return []
    failed = []
    for trial_id in storage._get_stale_trial_ids(study._study_id):
        try:
            storage.set_trial_user_attr(trial_id, "fail_reason", reason)
            storage.set_trial_user_attr(trial_id, "interrupted", True)
            storage.set_trial_state_values(trial_id, state=TrialState.FAIL)
        except UpdateFinishedTrialError:  # another worker (or the trial itself) got there first
            continue
        failed.append(storage.get_trial(trial_id))
    return failed


class Heartbeat:
    """Records a heartbeat for each trial in flight, from the sweeper's process.

    The sweeper outlives every trial it launched (it waits for the launcher), so its
    heartbeat stops exactly when nothing will tell the study how those trials ended.
    """

    def __init__(self, storage: RDBStorage, trial_ids: Iterable[int]) -> None:
        self.storage = storage
        self.trial_ids = list(trial_ids)
        self.interval = storage.heartbeat_interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="optuna-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        if self.interval is not None:
            self._record()  # at once: a trial with no heartbeat yet is never found stale
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _record(self) -> None:
        for trial_id in self.trial_ids:
            self.storage.record_heartbeat(trial_id)

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._record()
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
