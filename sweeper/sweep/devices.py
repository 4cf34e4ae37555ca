"""One trial per GPU: a pool of devices that concurrent runs lease one at a time.

`hydra.sweeper.devices=[cuda:0,cuda:1]` (or `[0,1]`) with `n_jobs` runs at once: each run
gets a device of its own, passed to it as `model.device`, and returns it when it ends, so a
run that is pruned frees its GPU for the next one at once.
"""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Iterator, Sequence
from typing import Any

from sweeper import SweepError


class DevicePool:
    def __init__(self, devices: Sequence[str]) -> None:
        self.devices = list(devices)
        self._free: queue.Queue[str] = queue.Queue()
        for device in self.devices:
            self._free.put(device)

    @classmethod
    def from_setting(cls, setting: Sequence[Any] | None, runs_at_once: int) -> DevicePool:
        """`null`: no pool (each run uses its config's model.device); else names or indices."""
        if not setting:
            return cls([])
        devices = [f"cuda:{d}" if isinstance(d, int) else str(d) for d in setting]
        if len(set(devices)) != len(devices):
            raise SweepError(f"hydra.sweeper.devices={devices}: a device is listed twice")
        if len(devices) < runs_at_once:
            raise SweepError(
                f"hydra.sweeper.devices={devices}: {runs_at_once} runs at once "
                f"(hydra.sweeper.n_jobs) need at least {runs_at_once} devices"
            )
        return cls(devices)

    @contextlib.contextmanager
    def lease(self) -> Iterator[str | None]:
        """A free device for the block (None without a pool); it waits while all are taken."""
        if not self.devices:
            yield None
            return
        device = self._free.get()
        try:
            yield device
        finally:
            self._free.put(device)
