"""Process signals: SIGTERM and SIGHUP (preemption, a time limit, `docker stop`) interrupt a
running sweep as Ctrl-C does, and local job processes end with the sweep. (Not early
stopping: a trial ends early when pruned, a search when the terminator stops it;
docs/glossary.md.)"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

from records.database import defer_interrupt

INTERRUPT_SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}


class SignalInterrupt(KeyboardInterrupt):
    """SIGTERM or SIGHUP: an interrupt, handled like Ctrl-C."""


def _raise_interrupt(signum: int, frame: Any) -> None:
    """Raise the interrupt, or, inside a store call, once that call has returned (a session
    cut mid-transaction would keep its locks from the handler's own writes)."""
    if signum == signal.SIGINT:
        interrupt: KeyboardInterrupt = KeyboardInterrupt()
    else:
        interrupt = SignalInterrupt(INTERRUPT_SIGNALS.get(signum, str(signum)))
    if not defer_interrupt(interrupt):
        raise interrupt


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """Within the block, these signals (and Ctrl-C) raise `SignalInterrupt` (KeyboardInterrupt),
    never inside a store call; the previous handlers come back."""
    handled = [*INTERRUPT_SIGNALS, signal.SIGINT]
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in handled}
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


def leave(message: str) -> None:
    """The last line, to stderr, then exit(1) at once."""
    print(message, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(1)
