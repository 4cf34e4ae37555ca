"""A packed member's thread and its turns: it runs until it asks the host (host.py) for
something, then waits until the host has answered the pack's requests and gives it a turn."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.packed.members import serve_as


def member_thread(index: int) -> str:
    """The name of member `index`'s thread (a sweep routes its log records by it)."""
    return f"packed-{index}"


@dataclass
class Member:
    """One trial of the pack: what its thread runs, and what it waits for."""

    host: Any  # its PackHost (host.py)
    index: int
    body: Callable[[], Any]  # ends in a train() that finds its member (members.current_source)
    rng_state: torch.Tensor = field(default_factory=torch.get_rng_state)
    request: tuple | None = None
    reply: Any = None
    result: Any = None  # what body returned, or the exception that ended it
    done: bool = False
    told: bool = False  # its end handed to run_bodies' `more`
    go: threading.Event = field(default_factory=threading.Event)

    def call(self, key: tuple, payload: Any) -> Any:
        """Ask the host for `key` (the kind of request and what must be equal to batch it)
        and wait, letting the others run, until the pack has answered."""
        self.request, self.reply = (key, payload), None
        self.rng_state = torch.get_rng_state()
        self.host.yield_to_host(self)
        torch.set_rng_state(self.rng_state)
        if isinstance(self.reply, BaseException):
            raise self.reply
        return self.reply

    def main(self) -> None:
        self.go.wait()
        self.go.clear()
        torch.set_rng_state(self.rng_state)
        serve_as(self)
        try:
            if self.host.stopping:  # the pack stopped before this member's first turn
                raise copy_error(self.host.stopping)
            self.result = self.body()
        except BaseException as e:  # a pruned trial, a failure: it leaves the pack
            self.result = e
            if isinstance(e, KeyboardInterrupt) and self.host.stopping is None:  # a signal
                self.host.interrupted = e  # deferred to this thread: it stops the whole pack
        finally:
            self.done = True
            self.host.detach(self)
            self.host.back.set()


def copy_error(error: BaseException) -> BaseException:
    """The same exception, new: each member raises its own (its traceback is its own)."""
    try:
        return type(error)(*error.args)
    except TypeError:
        return error
