"""How a running sweep is stopped: SIGTERM and SIGHUP (preemption, a time limit, `docker
stop`) raise like Ctrl-C, and local job processes end with the sweep."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

STOP_SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP: handled like Ctrl-C."""


def _raise_stopped(signum: int, frame: Any) -> None:
    raise Stopped(STOP_SIGNALS.get(signum, str(signum)))


@contextlib.contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """Within the block, the stop signals raise `Stopped`; the previous handlers come back."""
    previous = {sig: signal.signal(sig, _raise_stopped) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop_child_processes(grace_s: float = 5.0) -> None:
    """End local job processes (joblib's workers) so none trains on after the sweep stops."""
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        child.terminate()
    _, alive = psutil.wait_procs(children, timeout=grace_s)
    for child in alive:
        child.kill()
