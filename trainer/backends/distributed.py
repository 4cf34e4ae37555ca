"""One run over several processes: `launch(cfg, reporter, "module:function")`.

Trials across processes. `backend.processes=N` starts N ranks through torch.distributed's own
launcher (`python -m torch.distributed.run --standalone --nproc-per-node N`, a subprocess of
the job in a session of its own). Each rank runs `function(cfg, reporter)` in
`python -m trainer.backends.rank`: on CPU over gloo with one thread (OMP_NUM_THREADS=1),
on GPU over NCCL with device LOCAL_RANK of the trial's devices (`model.device=cuda:2,cuda:5`
from the sweeper's pool: CUDA_VISIBLE_DEVICES). Every rank checks the world size it sees: a
launcher that started fewer ranks than asked fails the trial in one line (accelerate's
`launch --cpu --num_processes 2` has been seen to start one).

Each rank talks to the job over a local socket (multiprocessing.connection, an authkey):
  - `reporter.report(step, metrics)` is a collective: every rank calls it at the same steps;
    rank 0's metrics go to the job's reporter, whose verdict (go on, or the exception it raised:
    TrialPruned, KeyboardInterrupt) is broadcast to every rank, which raises it at that call;
  - `reporter.resumed(step)`, the checkpoint step loaded, goes from rank 0 to the job's
    reporter (an exception it raises, e.g. TakenOver, stops the run);
  - rank 0 sends the TrainResult at the end, every rank its outcome (done, stopped, or the
    exception it raised).
The job then decides: a verdict is raised again; a rank's own error fails the trial with that
error (its type and message kept); a rank that died without a word (kill -9, the OOM killer),
with nothing but the collective errors its peers saw, raises RankLost: lost infrastructure,
queued again. Ctrl-C or SIGTERM in the job stops every rank (SIGTERM, then SIGKILL after
GRACE_S); whatever way it ends, no rank outlives launch().

Tested on CPU over gloo with 2 ranks (tests/test_distributed.py); not tested: GPUs, several
nodes (docs/trl.md, "Trials that span processes": the same ranks under a SLURM launcher job).
"""

from __future__ import annotations

import os
import pickle
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from multiprocessing.connection import wait as wait_ready
from pathlib import Path
from typing import Any

import psutil
from omegaconf import DictConfig, OmegaConf

from trainer.base.errors import RankLost, fail_reason

__all__ = ["launch"]

GRACE_S = 10.0  # how long stopped ranks get to end on their own before SIGKILL
POLL_S = 0.2
# What the job tells its ranks (environment variables of the launcher).
ENV_ADDRESS, ENV_AUTHKEY, ENV_CONFIG = "GRPO_DIST_ADDRESS", "GRPO_DIST_AUTHKEY", "GRPO_DIST_CONFIG"
ENV_MAIN, ENV_PROCESSES = "GRPO_DIST_MAIN", "GRPO_DIST_PROCESSES"
# With arguments torch.distributed.run itself, without them a rank (trainer/backends/rank.py).
RANK_ENTRY = "trainer.backends.rank"


def launch(cfg: DictConfig, reporter: Any, rank_main: str) -> Any:
    """Train with `rank_main` ("module:function", called as function(cfg, reporter)) on
    cfg.backend.processes ranks; returns rank 0's result. Raises the reporter's verdict, a
    rank's own error, or RankLost."""
    processes = int(cfg.backend.processes)
    cfg = cfg.copy()
    OmegaConf.resolve(cfg)  # the ranks run outside this process's Hydra context
    with socket.create_server(("127.0.0.1", 0)) as server, tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.pkl"
        config.write_bytes(pickle.dumps(cfg))
        authkey = secrets.token_bytes(32)
        env = {
            **os.environ,
            ENV_ADDRESS: f"127.0.0.1:{server.getsockname()[1]}",
            ENV_AUTHKEY: authkey.hex(),
            ENV_CONFIG: str(config),
            ENV_MAIN: rank_main,
            ENV_PROCESSES: str(processes),
            **_device_env(str(cfg.model.device)),
        }
        command = [sys.executable, "-m", RANK_ENTRY, "--standalone", "--nnodes", "1"]
        command += ["--nproc-per-node", str(processes), "--max-restarts", "0", "-m", RANK_ENTRY]
        launcher = subprocess.Popen(command, env=env, start_new_session=True)
        ranks = _Ranks(server, authkey, launcher, reporter, processes)
        try:
            ranks.serve()
        except BaseException:  # Ctrl-C, SIGTERM: stop every rank, then say so
            ranks.stop()
            raise
        finally:
            ranks.end_all()
        return ranks.outcome()


def _device_env(device: str) -> dict[str, str]:
    """CPU: one thread per rank. GPUs listed (cuda:2,cuda:5): rank r gets the r-th."""
    if not device.startswith("cuda"):
        return {"OMP_NUM_THREADS": "1"}
    indices = [d.partition(":")[2] for d in device.split(",") if d.partition(":")[2]]
    return {"CUDA_VISIBLE_DEVICES": ",".join(indices)} if indices else {}


class _Ranks:
    """The job's side of the channel: who said hello, what each rank said last."""

    def __init__(self, server, authkey, launcher, reporter, processes) -> None:
        self.server, self.authkey, self.launcher = server, authkey, launcher
        self.reporter, self.processes = reporter, processes
        self.open: dict[Connection, int] = {}  # connection -> rank (-1 before its hello)
        self.workers: list[psutil.Process] = []
        self.final: dict[int, str] = {}  # rank -> done | stopped | error
        self.errors: list[tuple[float, int, BaseException]] = []  # when raised, rank, error
        self.exits: dict[int, int] | None = None  # the launcher's word: failed rank -> status
        self.verdict: BaseException | None = None
        self.result: Any = None
        self.stop_at: float | None = None  # when the ranks were told to stop

    def serve(self) -> None:
        """Answer the ranks until the launcher has exited and every channel is closed."""
        ended_at = None
        while True:
            for ready in wait_ready([self.server, *self.open], timeout=POLL_S):
                if ready is self.server:
                    self._accept()
                else:
                    self._read(ready)
            if self.launcher.poll() is not None:
                ended_at = ended_at or time.monotonic()
                if not self.open:
                    return
                if time.monotonic() - ended_at > GRACE_S:  # orphans of a killed launcher
                    self.end_all()
            elif self.stop_at is not None and time.monotonic() - self.stop_at > GRACE_S:
                self.stop()

    def _accept(self) -> None:
        sock, _ = self.server.accept()
        sock.setblocking(True)
        conn = Connection(sock.detach())
        try:
            deliver_challenge(conn, self.authkey)
            answer_challenge(conn, self.authkey)
        except Exception:  # not one of ours (a wrong key, a closed socket)
            conn.close()
            return
        self.open[conn] = -1

    def _read(self, conn: Connection) -> None:
        try:
            kind, *body = conn.recv()
        except (EOFError, OSError):
            del self.open[conn]
            conn.close()
            return
        if kind == "hello":
            self.open[conn], pid = body
            self.workers.append(psutil.Process(pid))
        elif kind == "report":
            conn.send(self._verdict_on(*body))
        elif kind == "resumed":
            from trainer.run.train import report_resumed  # the job has it loaded already

            report_resumed(self.reporter, body[0])
        elif kind == "result":
            self.result = body[0]
        elif kind == "error":
            self.errors.append((body[0], self.open[conn], body[1]))
            self.final[self.open[conn]] = kind
        elif kind == "launcher":
            self.exits = body[0]
        else:  # done, stopped
            self.final[self.open[conn]] = kind

    def _verdict_on(self, step: int, metrics: dict[str, float]) -> BaseException | None:
        if self.verdict is None and self.reporter is not None:  # None: a plain library call
            try:
                self.reporter.report(step, metrics)
                return None
            except BaseException as e:  # TrialPruned, KeyboardInterrupt: for every rank
                self.verdict, self.stop_at = e, time.monotonic()
        return portable(self.verdict)

    def stop(self) -> None:
        """SIGTERM to the launcher and every rank, SIGKILL to those alive GRACE_S later."""
        procs = self._tree()
        for p in procs:
            _quietly(p.terminate)
        _, alive = psutil.wait_procs(procs, timeout=GRACE_S)
        for p in alive:
            _quietly(p.kill)
        self.stop_at = None

    def end_all(self) -> None:
        """Nothing outlives the run: SIGKILL whatever is left (the launcher reaped)."""
        procs = self._tree()
        for p in procs:
            _quietly(p.kill)
        psutil.wait_procs(procs, timeout=GRACE_S)
        self.launcher.wait()
        for conn in self.open:
            conn.close()

    def _tree(self) -> list[psutil.Process]:
        """The launcher, its descendants and the ranks that said hello (orphans included)."""
        procs = list(self.workers)
        try:
            root = psutil.Process(self.launcher.pid)
            procs += [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
        return [p for p in dict.fromkeys(procs) if _quietly(p.is_running)]

    def outcome(self) -> Any:
        """The run's ending, from what every rank and the launcher said (once all ended)."""
        if self.verdict is not None:
            raise self.verdict
        # Every rank finished its work: a crash in the teardown after it changes nothing.
        if all(self.final.get(r) == "done" for r in range(self.processes)):
            return self.result
        # Lost: a rank ended by a signal other than the SIGTERM with which torchrun ends the
        # others once one failed (or all by SIGTERM: none failed first), or a launcher that
        # could not say. A rank that saw its peer vanish raises too (gloo: "Connection reset
        # by peer"): its error is not the cause.
        exits = self.exits or {}
        killed = {r: s for r, s in exits.items() if s < 0 and s != -signal.SIGTERM}
        if not killed and exits and all(s == -signal.SIGTERM for s in exits.values()):
            killed = exits
        if killed or self.exits is None:
            how = ", ".join(f"rank {r} by {_signal_name(s)}" for r, s in sorted(killed.items()))
            how = how or f"the launcher ended with {self.launcher.returncode}"
            raise RankLost(f"a process of the run over {self.processes} was killed: {how}")
        if self.errors:  # the first error raised: the others follow from it
            _, rank, error = min(self.errors, key=lambda e: e[0])
            error.add_note(f"raised on rank {rank} of {self.processes}")
            raise error
        silent = sorted(set(range(self.processes)) - set(self.final))
        raise RankLost(f"rank(s) {silent} of {self.processes} ended without reporting")


def _signal_name(status: int) -> str:
    try:
        return signal.Signals(-status).name
    except ValueError:
        return f"signal {-status}"


def _quietly(call) -> Any:
    try:
        return call()
    except psutil.Error:
        return False


def portable(error: BaseException) -> BaseException:
    """The error itself when it crosses a process boundary intact, else its one line."""
    try:
        return pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(fail_reason(error))
