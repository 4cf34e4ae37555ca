"""Process signals: SIGTERM and SIGHUP (preemption, a time limit, `docker stop`) interrupt a
running sweep as Ctrl-C does, and local job processes end with the sweep. (Not early
stopping: a trial ends early when pruned, a search when the terminator stops it;
docs/glossary.md.)"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

INTERRUPT_SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}


class SignalInterrupt(KeyboardInterrupt):
    """SIGTERM or SIGHUP: an interrupt, handled like Ctrl-C."""


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise SignalInterrupt(INTERRUPT_SIGNALS.get(signum, str(signum)))


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """Within the block, these signals raise `SignalInterrupt`; the previous handlers come back."""
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in INTERRUPT_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def end_child_processes(grace_s: float = 5.0) -> None:
    """End local job processes (joblib's workers) so none trains on after the sweep stops."""
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        child.terminate()
    _, alive = psutil.wait_procs(children, timeout=grace_s)
    for child in alive:
        child.kill()
