"""Where a study lives: the storage URL, opening it safely (and retried), the plan's lock,
heartbeats.

Only RDB storages (SQLite, PostgreSQL, MySQL) are accepted: they are the ones Optuna gives
heartbeats, and heartbeats are how a restarted sweep tells a trial whose process died
(kill -9, a lost host) from one another worker is still running.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
import uuid
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import SQLAlchemyError

from analysis.stores import ResilientRDBStorage
from sweeper import SweepError
from sweeper import optuna_adapter as oa
from trainer.base.errors import first_line
from trainer.run.database import (
    DatabaseUnreachable,
    advisory_lock,
    note_if_slow,
    note_store_failure,
    retried,
    schema_lock,
    scheme,
    shown_url,
    sqlite_path,
)
from trainer.run.locks import flocked

SQLITE_TIMEOUT_S = 60  # several processes write one SQLite file: wait for the lock
CONNECT_TIMEOUT_S = 10  # a server that does not answer is retried, not waited on forever
BEAT_RETRY_S = 1.0  # a heartbeat that failed is tried again this soon
PLAN_LOCK_KEY = zlib.crc32(b"grpo-sweeper plan")  # one advisory lock per database


def store_name(url: str) -> str:
    """How messages name the study's store."""
    return f"hydra.sweeper.storage={shown_url(url)!r}"


# A template trial (a queued slot) carries this key: a creation retried after its reply was
# lost finds the trial it already made instead of queueing the slot twice.
WRITE_KEY = "grpo_sweeper_write_key"


def _create_new_trial(
    self: RDBStorage, study_id: int, template_trial: FrozenTrial | None = None
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


def _set_trial_state_values(
    self: RDBStorage, trial_id: int, state: TrialState, values: Sequence[float] | None = None
) -> bool:
    """A state already stored as asked (with the same values) was this call's own commit:
    a claim (WAITING -> RUNNING) is made under the plan's lock, a tell by the trial's owner."""

    def applied() -> tuple[bool, bool]:
        trial = RDBStorage.get_trial(self, trial_id)
        same = trial.state == state and (values is None or list(trial.values or []) == list(values))
        return same, True

    return retried(
        lambda: RDBStorage.set_trial_state_values(self, trial_id, state, values),
        self.store,
        applied=applied,
    )


ResilientRDBStorage._create_new_trial = _create_new_trial
ResilientRDBStorage.set_trial_state_values = _set_trial_state_values


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
    at a time creates or checks them (trainer.run.database.schema_lock).
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
            return ResilientRDBStorage(
                url,
                store=store_name(url),
                engine_kwargs=kwargs,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
            )

    try:
        return retried(create, store_name(url), window_s)
    except DatabaseUnreachable as e:
        if patient:
            raise
        reason = first_line(e.__cause__)
    except Exception as e:  # sqlalchemy, driver and OS errors alike: say which URL failed
        reason = first_line(e)
    raise SweepError(f"{store_name(url)}: cannot open it ({reason})") from None


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
    elif scheme(url) == "postgresql":
        with advisory_lock(url, PLAN_LOCK_KEY, store_name(url)):
            yield
    else:
        yield


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
        if self._thread.is_alive():  # a beat waiting for a lost database is not waited for
            self._thread.join(timeout=self.interval)

    def beat(self, trial_ids: Iterable[int]) -> None:
        """At once, e.g. when a trial starts: a trial with no heartbeat is never found stale."""
        if self.interval is not None:
            for trial_id in trial_ids:
                oa.record_heartbeat(self.study, trial_id)

    def _beat(self) -> None:
        # The RDB storage itself: its unretried method needs RDBStorage's session, which the
        # study's cache lacks (called on the cache, every beat failed and was swallowed).
        storage = oa.database_of(self.study)
        pause = self.interval
        while not self._stop.wait(pause):
            try:
                for trial_id in list(self.in_flight()):
                    # Not retried here: a thread that waited out a lost database would log
                    # after the sweep's last line.
                    started = time.monotonic()
                    RDBStorage.record_heartbeat(storage, trial_id)
                    note_if_slow(started)
                pause = self.interval
            except SQLAlchemyError:  # a busy (sqlite locked) or lost database: beat again in
                # a second, not an interval later, so busy moments never add up to the grace period
                note_store_failure()
                pause = min(BEAT_RETRY_S, self.interval)


def wait_for(predicate: Callable[[], bool], poll_s: float, timeout_s: float) -> bool:
    """Poll until predicate() holds or timeout_s passes; True if it held."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True
