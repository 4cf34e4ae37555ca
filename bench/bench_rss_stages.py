"""Where each trainer's peak RSS comes from on a bench_vs_trl workload: the peak (VmHWM) at
each stage of a run, and for ours the learner's and sampler's own peaks above the RSS each
phase started at.

    python bench/bench_rss_stages.py --workload default --steps 8 --repeats 2

Each run is its own process (bench_vs_trl's run of `ours-equal` or `trl`, the same work), the
two alternated. Stages: `started` (the interpreter, bench_vs_trl's own light imports),
`imports` (what the run imports before building anything), `setup` (the model, LoRA,
optimizer and sampler, or TRL's GRPOTrainer), then the end of the run. For ours, each phase's
peak is read with VmHWM reset before it (`/proc/self/clear_refs` 5, Linux): the baseline eval,
sampling, the learner's forward and backward, the optimizer step. Resetting VmHWM needs no
privilege; the stage values before the first phase are the process's true peak so far, later
ones are not (reset). The reset also resets ru_maxrss, so a run's `peak_rss_mib` here is the
highest VmHWM read before each reset and at the end: the true peak. -> bench/results/rss_stages_<workload>.json
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import bench_vs_trl as vs
from machine_info import machine

RESULTS = Path(__file__).parent / "results"
TRAINERS = ("ours-equal", "trl")
WORKLOADS = [name for name, work in vs.WORKLOADS.items() if work["model"] != "smollm2"]


def memory() -> dict[str, int]:
    """VmHWM (the peak since start or the last reset) and VmRSS, MiB."""
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            found[key] = round(int(value.split()[0]) / 1024)
    return found


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


class Stages:
    def __init__(self) -> None:
        self.stages: dict[str, int] = {}
        self.phases: dict[str, list[tuple[int, int]]] = {}  # (RSS at its start, peak above)
        self.busy = False
        self.peak = 0  # the run's own peak: the highest VmHWM read before any reset

    def high_water(self) -> int:
        self.peak = max(self.peak, memory()["VmHWM"])
        return self.peak

    def mark(self, name: str) -> None:
        self.stages[name] = memory()["VmHWM"]

    def phase(self, name: str, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            if self.busy:  # a phase inside another counts toward the outer one
                return fn(*args, **kwargs)
            self.busy, start = True, memory()["VmRSS"]
            self.high_water()
            reset_peak()
            try:
                return fn(*args, **kwargs)
            finally:
                self.high_water()
                self.phases.setdefault(name, []).append((start, memory()["VmHWM"] - start))
                self.busy = False

        return wrapped


def summary(pairs: list[tuple[int, int]]) -> dict:
    """A phase's runs: its peak above the RSS it started at, and the range of those RSS."""
    at, up = [a for a, _ in pairs], [u for _, u in pairs]
    peak = {"max": max(up), "median": statistics.median(up)}
    return {"peak_above_start": peak, "rss_at_start": [min(at), max(at)], "n": len(up)}


def run_ours(work: dict, path: Path, steps: int, stages: Stages) -> dict:
    import hydra  # noqa: F401  (run_ours's imports, before anything is built)

    import trainer.rl.pipelines as pipelines
    import trainer.rl.step as step
    import trainer.run.train as train

    stages.mark("imports")
    make_sampler = train.make_sampler

    def built(*args, **kwargs):
        sampler = make_sampler(*args, **kwargs)
        stages.mark("setup")
        return sampler

    train.make_sampler = built
    train.evaluate = stages.phase("evaluate", train.evaluate)
    pipelines.sample_groups = stages.phase("sample", pipelines.sample_groups)
    step.backward = stages.phase("forward_backward", step.backward)
    step.optimizer_step = stages.phase("optimizer", step.optimizer_step)
    return vs.run_ours_equal(work, path, steps)


def run_trl(work: dict, path: Path, steps: int, stages: Stages) -> dict:
    import datasets  # noqa: F401  (run_trl's imports, before anything is built)
    import peft  # noqa: F401
    import transformers  # noqa: F401
    import trl

    stages.mark("imports")
    init = trl.GRPOTrainer.__init__

    def built(self, *args, **kwargs):
        init(self, *args, **kwargs)
        stages.mark("setup")

    trl.GRPOTrainer.__init__ = built
    return vs.run_trl(work, path, steps)


def one_run(name: str, path: Path, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--workload", args.workload, "--steps", str(args.steps)]
    command += ["--only", name, "--model", str(path)]  # built here: the run imports nothing
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{name} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=WORKLOADS, default="default")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2, help="A B pairs")
    parser.add_argument("--note", default="", help="how the host was used, for the result")
    parser.add_argument("--only", choices=TRAINERS, help=argparse.SUPPRESS)  # internal
    parser.add_argument("--model", help=argparse.SUPPRESS)  # internal: the run's model
    args = parser.parse_args()
    work = vs.WORKLOADS[args.workload]
    if args.only:
        stages = Stages()
        stages.mark("started")
        import torch

        torch.set_num_threads(2)
        run = run_ours if args.only.startswith("ours") else run_trl
        result = run(work, Path(args.model), args.steps, stages)
        phases = {name: summary(pairs) for name, pairs in stages.phases.items()}
        # ru_maxrss (result's peak_rss_mib) is reset with VmHWM: the peak is the highest read
        tokens = result["median_tokens_per_step"]  # the work: both stop at end-of-sequence
        peak = stages.high_water()
        print(
            json.dumps({"peak_rss_mib": peak, "tokens_per_step": tokens, **stages.stages, **phases})
        )
        return
    path = vs.model_dir(work["model"])
    runs: dict[str, list[dict]] = {name: [] for name in TRAINERS}
    for repeat in range(args.repeats):
        for name in TRAINERS:
            runs[name].append(one_run(name, path, args))
            print(f"[{repeat + 1}/{args.repeats}] {name}: {json.dumps(runs[name][-1])}", flush=True)
    report = {
        "workload": {"name": args.workload, **work, "steps": args.steps},
        "machine": machine(args.note),
        "date": time.strftime("%Y-%m-%d"),
        "runs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"rss_stages_{args.workload}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(out)


if __name__ == "__main__":
    main()
