"""Where a step's time goes: `timed` records a block's wall-clock seconds under a metric name."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


@contextlib.contextmanager
def timed(metrics: dict[str, float], key: str) -> Iterator[None]:
    """metrics[key] = the seconds the block took (not set when it raises)."""
    started = time.perf_counter()
    yield
    metrics[key] = time.perf_counter() - started
