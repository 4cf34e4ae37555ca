"""The CPU threads a run computes with, chosen for the host and for what else runs on it.

torch takes every core by default. Where anything else runs beside a run (the sweep's other
lanes, a second test worker, a user's other work), its threads wait on each other: two threads
beside one busy process trained the tiny model 2.7x slower than one thread, and 12x slower
beside the test suite (bench/THREADS.md). Alone on the host, two threads win on every model
measured, the tiny one included. The rule:

1. `model.threads=N` wins; so does OMP_NUM_THREADS when the user set it (torch read it).
2. Else the cores this process may use (its CPU affinity, a container's CPU quota), shared
   among the runs at once on this host (RUNS_AT_ONCE: the sweep's lanes, the test workers),
   less the cores other processes kept busy over a short look; at least one (`choose`).

The choice is made once, as the run starts, and recorded (records.metrics.THREADS_PARAM). The
thread count changes float rounding: a run's numbers are reproducible at a fixed count.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

RUNS_AT_ONCE = "GRPO_SWEEPER_RUNS_AT_ONCE"  # runs at once on this host (the sweep's lanes)
LOOK_S = 0.3  # how long `busy_elsewhere` watches the host's CPU time
USER_VARIABLE = "OMP_NUM_THREADS"


@dataclass(frozen=True)
class Threads:
    count: int
    why: str


def choose(cores: int, runs_at_once: int, busy_elsewhere: float) -> Threads:
    """Rule 2 above, pure. `busy_elsewhere`: cores other processes kept busy."""
    share = max(1, cores // max(1, runs_at_once))
    # A core counts as taken once another process used more than half of it.
    free = max(1, cores - math.floor(busy_elsewhere + 0.5))
    parts = [f"{cores} cores"]
    if runs_at_once > 1:
        parts.append(f"{runs_at_once} runs at once")
    if free < cores:
        parts.append(f"{busy_elsewhere:.1f} busy elsewhere")
    return Threads(min(share, free), ", ".join(parts))


def usable_cores() -> int:
    """The cores this process may run on: its affinity, capped by a cgroup CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_quota()
    return max(1, min(cores, math.floor(quota))) if quota else cores


def cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """A container's CPU limit in cores (cgroup v2 cpu.max, or v1's CFS quota); None: none."""
    v2 = root / "cpu.max"
    v1 = root / "cpu" / "cpu.cfs_quota_us", root / "cpu" / "cpu.cfs_period_us"
    try:
        if v2.exists():
            quota, period = v2.read_text().split()[:2]
        elif v1[0].exists():
            quota, period = v1[0].read_text().strip(), v1[1].read_text().strip()
        else:
            return None
    except (OSError, ValueError):
        return None
    if quota in ("max", "-1"):
        return None
    return int(quota) / int(period)


def busy_elsewhere(seconds: float = LOOK_S) -> float:
    """Cores that other processes kept busy over `seconds` (Linux's /proc/stat, less this
    process's own CPU time); 0.0 where that cannot be read."""
    try:
        first, own_first = _host_cpu(), _own_cpu()
        time.sleep(seconds)
        busy, total = (b - a for a, b in zip(first, _host_cpu(), strict=True))
        own = _own_cpu() - own_first
    except (OSError, ValueError):
        return 0.0
    if total <= 0:
        return 0.0
    cores = os.cpu_count() or 1
    elapsed = total / cores  # host jiffies per core over the look
    return max(0.0, busy / elapsed - own / seconds)


def _host_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot: total less idle and iowait."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system


def decide(setting: object) -> Threads:
    """The run's threads: `model.threads` (auto or N), else the user's OMP_NUM_THREADS, else
    `choose` on this host."""
    import torch

    if setting != "auto":
        return Threads(int(setting), f"model.threads={setting}")
    if os.environ.get(USER_VARIABLE):
        return Threads(torch.get_num_threads(), f"{USER_VARIABLE}={os.environ[USER_VARIABLE]}")
    runs_at_once = int(os.environ.get(RUNS_AT_ONCE, "1") or 1)
    return choose(usable_cores(), runs_at_once, busy_elsewhere())


def rank_threads(setting: object) -> Threads:
    """A rank's threads in a run over several CPU processes: one each (torchrun's and
    accelerate's habit), or `model.threads=N`."""
    return (
        Threads(1, "one per rank")
        if setting == "auto"
        else Threads(int(setting), f"model.threads={setting}")
    )


def apply(threads: Threads) -> None:
    import torch

    if torch.get_num_threads() != threads.count:
        torch.set_num_threads(threads.count)
