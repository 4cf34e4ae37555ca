"""The trial process: `python -m sweeper -m ...` starts it with the command, and it loads what
a trial needs (torch, transformers, PEFT, MLflow: seconds of CPU) on a second core while the
sweep composes its config, checks its plan and opens its stores. The basic launcher's jobs then
run in it one at a time (or a pack at a time: sweeper/sweep/packs.py), as they would in the
sweep's own process: Hydra's launcher, the same log files and live line.

Signals reach a job through the sweep: the process has a process group of its own, so a
terminal's Ctrl-C reaches the sweep only, which passes it (or SIGTERM, SIGHUP) on once and
waits for the job to record how it ended. It dies with the sweep (SIGKILL included).

Without it (the sweeper started from Python, a launcher with workers of its own, a system
other than POSIX, `-X importtime`) jobs run as before, in the sweep's process or the
launcher's workers.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

TRIAL_MODULE = "sweeper.sweep.job"  # what a trial imports: torch, transformers, PEFT, MLflow
INTERRUPT_WAIT_S = 60.0  # how long an interrupted job has to record how it ended
NOT_SWEEPS = ("--help", "-h", "--hydra-help", "--info", "-i", "--cfg", "-c", "--shell-completion")


@dataclass(frozen=True)
class Interrupted:
    """A job's reply when a signal stopped it: the signal's name ("" for Ctrl-C)."""

    signal: str


@dataclass(frozen=True)
class Ended:
    """A pack member's end, sent while the pack runs: the sweep answers with the job that
    takes its slot (its overrides and id), or None (packs.launch's `more`)."""

    member: int
    job_return: Any


@dataclass
class _Handle:
    process: multiprocessing.process.BaseProcess
    connection: Connection


_handle: _Handle | None = None


def start_for(argv: list[str]) -> None:
    """Start the trial process when `argv` runs a sweep (`-m`): before Hydra, so that its
    imports overlap everything the sweep does before its first job."""
    sweep = {"-m", "--multirun"} & set(argv) and not set(NOT_SWEEPS) & set(argv)
    # -X importtime profiles this process's imports: a second process's, on the same stderr,
    # would mix with them (the trial's imports are then made here, as without it)
    profiled = "importtime" in sys._xoptions
    if _handle is None and sweep and os.name == "posix" and not profiled:  # POSIX: pgrp, SIGKILL
        start()


def start() -> None:
    global _handle
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no threads, no locks
    ours, theirs = context.Pipe()
    process = context.Process(target=_serve, args=(theirs, os.getpid()), name="trials")
    process.start()
    theirs.close()
    _handle = _Handle(process, ours)
    atexit.register(stop)  # before multiprocessing's own exit, which would wait for it


def stop() -> None:
    """No more jobs: end it at once. Between jobs it holds nothing that needs saving (and a
    job in flight at exit has already been interrupted)."""
    global _handle
    if _handle is None:
        return
    handle, _handle = _handle, None
    with contextlib.suppress(OSError):
        handle.connection.close()
    handle.process.kill()
    handle.process.join()


def task_reference(task_function: Any) -> tuple[str, str] | None:
    """(module, name) the trial process finds `task_function` by, or None when it cannot
    (a lambda, a closure, a function not bound at its module's top level)."""
    module_name, name = task_function.__module__, task_function.__qualname__
    module = sys.modules.get(module_name)
    if module_name == "__main__":  # `python -m sweeper`: the module's import name
        spec = getattr(module, "__spec__", None)
        module_name = spec.name if spec is not None else ""
    bound = getattr(module, name, None) if module is not None and "." not in name else None
    if module_name and bound is not None and getattr(bound, "__wrapped__", bound) is task_function:
        return module_name, name
    return None


def usable(task_function: Any) -> bool:
    return (
        _handle is not None and _handle.process.is_alive() and bool(task_reference(task_function))
    )


def launch(
    hydra_context: Any,
    task_function: Any,
    config: Any,
    job_overrides: list[list[str]],
    job_ids: list[int],
    more: Callable[[int, Any], Any] | None = None,
) -> list[Any]:
    """Jobs through the basic launcher in the trial process, one, or several as a pack
    (sweeper/sweep/packs.py); their JobReturns. `more` is packs.launch's, called here (in
    this thread) as the process tells of each member's end.

    An interrupt while it runs is passed on, and the job's own record of it awaited, before
    the interrupt goes on here. RuntimeError: the process died (it is not restarted)."""
    from hydra.core.singleton import Singleton

    assert _handle is not None
    handle = _handle
    request = (
        hydra_context,
        task_reference(task_function),
        config,
        job_overrides,
        job_ids,
        Singleton.get_state(),
        more is not None,
    )
    try:
        handle.connection.send_bytes(cloudpickle.dumps(request))  # resolvers are local functions
        while isinstance(reply := pickle.loads(handle.connection.recv_bytes()), Ended):
            _send(handle.connection, cloudpickle.dumps(more(reply.member, reply.job_return)))
    except KeyboardInterrupt as interrupt:
        _pass_on(handle, interrupt)
        raise
    except (EOFError, OSError):
        handle.process.join(timeout=5)  # its exit code, once the kernel has it
        raise RuntimeError(
            f"the trial process ended (exit code {handle.process.exitcode})"
        ) from None
    if isinstance(reply, Interrupted):  # a signal sent to it alone: the sweep stops, as inline
        from sweeper.sweep.signals import SignalInterrupt

        raise SignalInterrupt(reply.signal) if reply.signal else KeyboardInterrupt()
    return reply


def import_in_background() -> None:
    """Without a trial process: the first job's imports in a thread of this process while the
    stores are created (a thread shares the GIL, so only the stores' disk waits overlap)."""

    def load() -> None:
        with contextlib.suppress(Exception):  # the trial's own import says what went wrong
            importlib.import_module(TRIAL_MODULE)

    threading.Thread(target=load, name=f"import {TRIAL_MODULE}", daemon=True).start()


def _pass_on(handle: _Handle, interrupt: KeyboardInterrupt) -> None:
    """The job gets the signal the sweep got, then has INTERRUPT_WAIT_S to record its end."""
    from sweeper.sweep.signals import INTERRUPT_SIGNALS

    by_name = {name: sig for sig, name in INTERRUPT_SIGNALS.items()}
    sig = by_name.get(str(interrupt), signal.SIGINT)
    with contextlib.suppress(ProcessLookupError):
        os.kill(handle.process.pid, sig)
    deadline = time.monotonic() + INTERRUPT_WAIT_S
    with contextlib.suppress(EOFError, OSError, KeyboardInterrupt):  # a second Ctrl-C: go now
        while handle.connection.poll(max(0.0, deadline - time.monotonic())):
            if not isinstance(pickle.loads(handle.connection.recv_bytes()), Ended):
                return  # the jobs' reply: each recorded its end (a member's end: not yet)


# --- in the trial process -------------------------------------------------------------


def _serve(connection: Connection, sweep_pid: int) -> None:
    os.setpgrp()  # a terminal's signals go to the sweep, which passes them on: each comes once
    _die_with(sweep_pid)
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())  # not multiprocessing's: a killed process would leak it
    gc.disable()  # imports make objects, not garbage: collecting meanwhile is seconds lost
    with contextlib.suppress(Exception):  # a broken import is the job's to report, in its log
        importlib.import_module(TRIAL_MODULE)
    gc.freeze()  # and no collection during training walks what they made
    gc.enable()
    while True:
        try:
            request = pickle.loads(connection.recv_bytes())
        except (EOFError, OSError, KeyboardInterrupt):
            os._exit(0)  # the sweep is done: nothing to save, no teardown to wait for
        reply = _run(connection, *request)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            connection.send_bytes(cloudpickle.dumps(reply))
        except Exception as e:  # a result that does not pickle: the job failed, and says why
            connection.send_bytes(cloudpickle.dumps([_unpicklable(e)] * len(request[3])))


def _unpicklable(error: Exception) -> Any:
    from sweeper import optuna_adapter as oa
    from sweeper.plan.preflight import one_line

    return oa.failed_return(RuntimeError(f"{type(error).__name__}: {one_line(error)}"))


def _ask_for_more(connection: Connection) -> Callable[[int, Any], Any]:
    """packs.launch's `more`, answered by the sweep (launch, above) as each member ends."""

    def more(member: int, job_return: Any) -> Any:
        sys.stdout.flush()
        try:
            message = cloudpickle.dumps(Ended(member, job_return))
        except Exception as e:  # as the final reply: the job failed, and says why
            message = cloudpickle.dumps(Ended(member, _unpicklable(e)))
        _send(connection, message)
        return pickle.loads(connection.recv_bytes())  # a signal meanwhile stops the pack

    return more


def _send(connection: Connection, message: bytes) -> None:
    """A message sent whole: a signal meanwhile (an interrupt) waits until it is sent, as in a
    store call, since one cut in half would garble the pipe for the replies to come."""
    from records.database import store_call

    with store_call():
        connection.send_bytes(message)


def _run(
    connection: Connection,
    hydra_context: Any,
    task: tuple[str, str],
    config: Any,
    job_overrides: list[list[str]],
    job_ids: list[int],
    singleton_state: Any,
    refill: bool,
) -> Any:
    from hydra.core.singleton import Singleton

    from sweeper.results import display
    from sweeper.sweep import packs
    from sweeper.sweep.signals import SignalInterrupt, signals_interrupt

    Singleton.set_state(singleton_state)
    display.trials_run_here()
    display.quiet_third_party(config.hydra.verbose)
    bound = getattr(importlib.import_module(task[0]), task[1])
    task_function = getattr(bound, "__wrapped__", bound)  # under @hydra.main
    with signals_interrupt():
        try:
            more = _ask_for_more(connection) if refill else None
            return packs.launch(hydra_context, task_function, config, job_overrides, job_ids, more)
        except SignalInterrupt as e:
            return Interrupted(str(e))
        except KeyboardInterrupt:
            return Interrupted("")


def _die_with(sweep_pid: int) -> None:
    """SIGKILL when the sweep's process ends, however it ends (Linux's parent-death signal;
    elsewhere a thread that watches for the sweep to be gone)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, signal.SIGKILL) != 0:  # PR_SET_PDEATHSIG
            raise OSError
    except (OSError, AttributeError):
        threading.Thread(target=_watch, args=(sweep_pid,), daemon=True).start()
    if os.getppid() != sweep_pid:  # it ended before the signal was set
        os._exit(1)


def _watch(sweep_pid: int) -> None:
    while os.getppid() == sweep_pid:
        threading.Event().wait(1.0)
    os._exit(1)
