"""The time a training step's matrix products take, for bench_vs_trl.py --matmul.

Both trainers must compute our products (TRL's are a superset: each rollout repeats its
prompt, and PEFT adds three matmuls a layer), so their time bounds a step's at this machine's
BLAS: no change that keeps the arithmetic can bring a step under it.
"""

from __future__ import annotations

MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}  # BLAS products


class MatmulClock:
    """The matrix products' own time (torch.profiler's self CPU time) over steps first + 1 to
    first + count of a run. The profiler slows the run: its step times are not comparable with
    an unprofiled run's."""

    def __init__(self, first: int = 2, count: int = 3) -> None:
        self.first, self.count, self.ended = first, count, 0
        self.profiler = None
        self.seconds_per_step = float("nan")

    def step_ended(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.ended += 1
        if self.ended == self.first:
            self.profiler = profile(activities=[ProfilerActivity.CPU])
            self.profiler.start()
        elif self.ended == self.first + self.count:
            self.profiler.stop()
            events = self.profiler.key_averages()
            total_us = sum(e.self_cpu_time_total for e in events if e.key in MATMUL_OPS)
            self.seconds_per_step = total_us / 1e6 / self.count
