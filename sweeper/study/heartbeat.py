"""Heartbeats for the trials a sweeper has in flight, recorded from its own process, and a
poll that waits for the study to reach a state (records/optuna_storage.py opens the storage)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

import optuna
from optuna.storages import RDBStorage
from sqlalchemy.exc import SQLAlchemyError

from records.database import note_if_slow, note_store_failure
from sweeper import optuna_adapter as oa

BEAT_RETRY_S = 1.0  # a heartbeat that failed is tried again this soon


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
            # A busy (sqlite locked) or lost database: beat again in a second, not an interval
            # later, so busy moments never add up to the grace period. A link lost at the
            # commit reaches here as Optuna's StorageInternalError; uncaught, it ended the
            # thread and every later trial of this worker looked dead (a cut link, healed).
            except (SQLAlchemyError, optuna.exceptions.StorageInternalError):
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
