"""One trial per GPU: a pool of devices that concurrent runs lease.

`hydra.sweeper.devices=[cuda:0,cuda:1]` (or `[0,1]`) with `n_jobs` runs at once: each run
gets a device of its own, passed to it as `model.device`, and returns it when it ends, so a
run that is pruned frees its GPU for the next one at once. A run over N processes
(`backend.processes=N`) takes N devices at once (`model.device=cuda:0,cuda:1`, one a rank:
trainer/backends/distributed.py); `n_jobs` still counts runs.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from sweeper import SweepError


class DevicePool:
    def __init__(self, devices: Sequence[str], per_run: int = 1) -> None:
        self.devices = list(devices)
        self.per_run = per_run
        self._free = list(self.devices)
        self._changed = threading.Condition()

    @classmethod
    def from_setting(
        cls, setting: Sequence[Any] | None, runs_at_once: int, per_run: int = 1
    ) -> DevicePool:
        """`null`: no pool (each run uses its config's model.device); else names or indices.
        per_run: the devices one run takes (its processes)."""
        if not setting:
            return cls([])
        devices = [f"cuda:{d}" if isinstance(d, int) else str(d) for d in setting]
        if len(set(devices)) != len(devices):
            raise SweepError(f"hydra.sweeper.devices={devices}: a device is listed twice")
        if len(devices) < runs_at_once * per_run:
            each = f" of {per_run} processes (backend.processes)" if per_run > 1 else ""
            raise SweepError(
                f"hydra.sweeper.devices={devices}: {runs_at_once} runs at once "
                f"(hydra.sweeper.n_jobs){each} need at least {runs_at_once * per_run} devices"
            )
        return cls(devices, per_run)

    @contextlib.contextmanager
    def lease(self) -> Iterator[str | None]:
        """The block's devices, comma-separated (None without a pool); it waits while fewer
        than a run's are free, and takes them all at once (no two runs holding half each)."""
        if not self.devices:
            yield None
            return
        with self._changed:
            self._changed.wait_for(lambda: len(self._free) >= self.per_run)
            taken, self._free = self._free[: self.per_run], self._free[self.per_run :]
        try:
            yield ",".join(taken)
        finally:
            with self._changed:
                self._free += taken
                self._changed.notify_all()
