"""A rank of a run over several processes, and the launcher that starts them: what
`python -m trainer.backends.rank` runs (trainer/backends/distributed.py starts it, and says
how the job and its ranks talk). With arguments it is torch.distributed.run, telling the job
how each failed rank ended; without, one rank under it."""

from __future__ import annotations

import importlib
import os
import pickle
import sys
import time
from multiprocessing.connection import Client, Connection
from pathlib import Path

from trainer.backends.distributed import (
    ENV_ADDRESS,
    ENV_AUTHKEY,
    ENV_CONFIG,
    ENV_MAIN,
    ENV_PROCESSES,
    portable,
)
from trainer.model import cpu_threads


class RankReporter:
    """The reporter every rank gets: a collective (trainer/backends/distributed.py says how)."""

    def __init__(self, conn: Connection, rank: int) -> None:
        self.conn, self.rank = conn, rank
        self.verdict: BaseException | None = None

    def report(self, step: int, metrics: dict[str, float]) -> None:
        import torch.distributed as dist

        verdict = [None]
        if self.rank == 0:
            self.conn.send(("report", step, dict(metrics)))
            verdict[0] = self.conn.recv()
        dist.broadcast_object_list(verdict, src=0)
        if verdict[0] is not None:
            self.verdict = verdict[0]
            raise self.verdict

    def resumed(self, step: int | None) -> None:
        """The checkpoint step loaded (the same on every rank): rank 0 says it to the job."""
        if self.rank == 0:
            self.conn.send(("resumed", step))


def _connect() -> Connection:
    host, _, port = os.environ[ENV_ADDRESS].rpartition(":")
    return Client((host, int(port)), authkey=bytes.fromhex(os.environ[ENV_AUTHKEY]))


def rank_entry() -> None:
    import torch
    import torch.distributed as dist

    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    conn = _connect()
    conn.send(("hello", rank, os.getpid()))
    reporter = RankReporter(conn, rank)
    finished = False
    try:
        cfg = pickle.loads(Path(os.environ[ENV_CONFIG]).read_bytes())
        if torch.cuda.is_available() and str(cfg.model.device).startswith("cuda"):
            torch.cuda.set_device(local)
            cfg.model.device = f"cuda:{local}"
            dist.init_process_group("nccl")
        else:
            torch.set_num_threads(cpu_threads.rank_threads(cfg.model.get("threads", "auto")).count)
            dist.init_process_group("gloo")
        expected, world = int(os.environ[ENV_PROCESSES]), dist.get_world_size()
        if world != expected:
            raise RuntimeError(
                f"backend.processes={expected}: rank {rank} sees a world size of {world}; "
                f"the launcher did not start {expected} processes"
            )
        module, _, function = os.environ[ENV_MAIN].partition(":")
        result = getattr(importlib.import_module(module), function)(cfg, reporter)
        if rank == 0:
            conn.send(("result", result))
        conn.send(("done",))
        finished = True
    except BaseException as e:
        if e is reporter.verdict:
            conn.send(("stopped",))
        else:
            conn.send(("error", time.time(), portable(e)))
            raise
    finally:
        if dist.is_initialized():
            if finished:  # no rank tears gloo down while a peer still uses it
                dist.barrier()
            dist.destroy_process_group()
        conn.close()


def launcher_entry(argv: list[str]) -> None:
    """torch.distributed.run, telling the job how each failed rank ended (its exit status,
    negative for a signal) before it exits."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    exits: dict[int, int] = {}
    try:
        run(parse_args(argv))
    except ChildFailedError as e:
        exits = {rank: failure.exitcode for rank, failure in e.failures.items()}
        raise SystemExit(1) from None
    finally:
        with _connect() as conn:
            conn.send(("launcher", exits))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        launcher_entry(sys.argv[1:])
    else:
        rank_entry()
