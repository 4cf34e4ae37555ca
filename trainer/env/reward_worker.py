"""Rewards that may never return, called in a child process with a time limit per call.

Python threads cannot be killed and `signal.alarm` works on the main thread only (the async
pipeline scores in its sampler thread), so the rewards that can hang (a user's `_target_`,
math_verify on adversarial text) run in one persistent child per run. The parent sends a batch
of calls at once and waits on each answer with `Connection.poll(timeout)`; a call past the
limit scores 0, the child is killed and a fresh one takes the rest of the batch. The child
builds the rewards again from their config entries: functions made inside a module (the
built-in closures) do not pickle, and a user's function may not either.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from trainer.base.errors import ConfigError

log = logging.getLogger(__name__)

STARTUP_S = 120  # a fresh child imports torch-free modules and the user's: seconds at most
WINDOW = 16  # a reward whose last WINDOW calls timed out more than half the time stops the run
OURS, TRL = "ours", "trl"  # fn(problem, completion, finished), or TRL's keyword lists


def serve(conn, entries: dict[str, Any]) -> None:
    """The child: answers each call of a batch with ("ok", value) or ("error", kind, line),
    and stops the batch at an error (the parent raises it)."""
    from trainer.env.rewards import RewardError, call_reward, raised, resolve

    fns = {name: resolve(entry)[1] for name, entry in entries.items()}
    conn.send(("ready",))  # the time limit counts from here, not from the imports
    while True:
        try:
            style, name, calls = conn.recv()
        except (EOFError, OSError):
            return
        for call in calls:
            try:
                if style == OURS:
                    value = call_reward(name, fns[name], *call)
                else:
                    value = list(fns[name](**call))
            except (ConfigError, RewardError) as e:
                conn.send(("error", type(e).__name__, str(e)))
                break
            except Exception as e:  # a TRL-style reward's own error, named as in process
                line = raised(name, e, str(call["completions"][0]))
                conn.send(("error", RewardError.__name__, line))
                break
            conn.send(("ok", value))


class RewardWorker:
    """One child process scoring the `entries` (metric name -> config entry), each call
    bounded by `timeout` seconds; thread-safe (the sampler thread and evaluate share it)."""

    def __init__(self, entries: dict[str, Any], timeout: float) -> None:
        self.entries, self.timeout = entries, float(timeout)
        self.recent = {name: collections.deque(maxlen=WINDOW) for name in entries}
        self.warned = False
        self._lock = threading.Lock()
        self._process = self._conn = self._finalizer = None

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")  # no fork of a threaded parent
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=serve, args=(child, self.entries), daemon=True, name="reward-worker"
        )
        self._process.start()
        child.close()
        self._finalizer = weakref.finalize(self, stop, self._process, self._conn)
        try:
            ready = self._conn.poll(STARTUP_S) and self._conn.recv()
        except EOFError:
            ready = False
        if ready != ("ready",):
            self._kill()
            raise RuntimeError(f"the reward worker process did not start in {STARTUP_S}s")

    def _kill(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # stops the child, once
        self._process = self._conn = self._finalizer = None

    def run(self, style: str, name: str, calls: list) -> tuple[list, int]:
        """(each call's answer, None where it timed out; how many timed out). A reward that
        raises raises RewardError here; one that times out too often stops the run."""
        from trainer.env.rewards import RewardError

        answers: list = []
        timeouts = 0
        with self._lock:
            while len(answers) < len(calls):
                if self._process is None:
                    self._start()
                pending = calls[len(answers) :]
                self._conn.send((style, name, pending))
                for call in pending:
                    if not self._conn.poll(self.timeout):
                        self._kill()  # the rest go to a fresh child
                        answers.append(None)
                        timeouts += 1
                        self._timed_out(name, call)
                        break
                    try:
                        reply = self._conn.recv()
                    except EOFError:  # the reward ended the child (os._exit, a crash)
                        self._kill()
                        raise RewardError(f"reward {name!r} ended its worker process") from None
                    if reply[0] == "error":
                        _, kind, line = reply
                        raise (ConfigError if kind == "ConfigError" else RewardError)(line)
                    answers.append(reply[1])
                    self.recent[name].append(False)
        return answers, timeouts

    def _timed_out(self, name: str, call) -> None:
        from trainer.env.rewards import RewardError, shorten

        recent = self.recent[name]
        recent.append(True)
        if sum(recent) > WINDOW // 2:
            raise RewardError(
                f"reward {name!r} timed out (task.reward_timeout={self.timeout:g}s) on "
                f"{sum(recent)} of its last {len(recent)} calls: it hangs; fix it, or raise "
                "task.reward_timeout"
            )
        if not self.warned:
            self.warned = True
            text = call[1] if isinstance(call, tuple) else str(call["completions"][0])
            log.warning(
                "reward %r took longer than task.reward_timeout=%gs (on completion %r): "
                "scored 0, counted in reward/timeouts; warned once per run",
                name,
                self.timeout,
                shorten(text),
            )

    def close(self) -> None:
        with self._lock:
            self._kill()


def stop(process, conn) -> None:
    """Kill the child and close the pipe (both may be gone already)."""
    if conn is not None:
        conn.close()
    if process is not None and process.is_alive():
        process.kill()
        process.join()


def bound(rewards, timeout: float) -> None:
    """Call a RewardSet's rewards that may hang in a worker process, `timeout` seconds a call."""
    from trainer.env.rewards import may_hang
    from trainer.env.trl_rewards import TrlStyleReward

    bounded = {
        name: entry
        for (name, entry), fn in zip(rewards.entries.items(), rewards.fns, strict=True)
        if may_hang(entry, fn)
    }
    if timeout <= 0 or not bounded:
        return
    rewards.worker = RewardWorker(bounded, timeout)
    for i, name in enumerate(rewards.names):
        if name in bounded:
            child = ChildReward(rewards.worker, name, bounded[name])
            if isinstance(rewards.fns[i], TrlStyleReward):  # called as ours, TRL's lists inside
                rewards.fns[i].fn = child
            else:
                rewards.fns[i] = child


class ChildReward:
    """A reward of the worker's, called as the in-process one was: ours as
    fn(problem, completion, finished), a TRL-style one with TRL's keyword lists; a call
    that times out scores 0 (each of its completions, for a TRL-style one)."""

    def __init__(self, worker: RewardWorker, name: str, entry: Any) -> None:
        trl = isinstance(entry, Mapping) and entry.get("style") == TRL
        self.worker, self.name, self.style = worker, name, TRL if trl else OURS

    def batch(self, calls: list) -> tuple[list[float], int]:
        answers, timeouts = self.worker.run(OURS, self.name, calls)
        return [0.0 if a is None else a for a in answers], timeouts

    def trl_batch(self, columns: dict) -> tuple[list, int]:
        """A TRL-style call's scores, and 1 when it timed out (each completion then scores 0)."""
        (answer,), timeouts = self.worker.run(TRL, self.name, [columns])
        return ([0.0] * len(columns["completions"]) if answer is None else answer), timeouts

    def __call__(self, *args, **columns):
        if self.style == OURS:
            return self.batch([args])[0][0]
        return self.trl_batch(columns)[0]
