"""How long a command takes to answer when it does no training: a bad input, or --help;
and with --sweep, how long the README's main sweep takes to its first training step and to
its verdict, as a newcomer meets it.

    python bench/bench_startup.py [--before /tmp/before] [--repeats 5]
    python bench/bench_startup.py --sweep [--repeats 3] [--before /tmp/before] [--first-step]

Each command runs in a fresh process in an empty directory, from this checkout and, with
--before, from an older one (its root put first on PYTHONPATH), alternated: this, before,
this, before, ... Per command and checkout: the median wall time and every round's. A bad
input is what a user meets most often before a sweep, and the bad-input tests run it 20 times.
Nothing here asserts a timing. Results: bench/results/startup.json.

--sweep: `python -m sweeper -m group_size=4,8 lr=1e-3,2e-3` (README.md's main job), each run
in a fresh empty directory with a fresh HOME (no cache: the shipped tiny model is what it
loads), no MLFLOW_TRACKING_URI (a new mlflow.db). Per run: start -> the first trial's
"Training N steps" line in its log file (logged after the step-0 baseline eval, right
before step 1), start -> the verdict's table on stdout, start -> exit, and the load average
before it. Medians over the runs; with --before, this checkout and the older one alternate,
and --first-step stops each sweep at its first step (on a busy host, the full sweeps of two
checkouts take long). Results: bench/results/startup_sweep.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from machine_info import machine  # bench/ is on the path: this runs as a script

README_SWEEP = ["sweeper", "-m", "group_size=4,8", "lr=1e-3,2e-3"]

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {  # name -> (arguments after `python -m`, the exit code it should end with)
    "sweeper, bad input": (["sweeper", "-m", "lr=0"], 1),
    "trainer, bad input": (["trainer", "lr=0"], 1),
    "sweeper --help": (["sweeper", "--help"], 0),
}


def wall(code: Path, args: list[str], expected: int) -> float:
    with tempfile.TemporaryDirectory() as cwd:
        env = {
            **os.environ,
            "PYTHONPATH": str(code),
            "MLFLOW_TRACKING_URI": f"sqlite:///{cwd}/mlflow.db",
        }
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True
        )
        elapsed = time.perf_counter() - started
    if done.returncode != expected:
        raise SystemExit(f"{args} from {code} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return elapsed


def first_sweep(code: Path, first_step_only: bool = False) -> dict[str, float | None]:
    """One run of the README's sweep as a newcomer meets it: seconds to its first step, to
    its verdict, to its exit (first_step_only: stopped at its first step)."""
    with tempfile.TemporaryDirectory() as cwd:
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
        env.update(PYTHONPATH=str(code), HOME=f"{cwd}/home")
        for cache in ("XDG_CACHE_HOME", "HF_HOME", "TORCHINDUCTOR_CACHE_DIR"):
            env.pop(cache, None)
        load = os.getloadavg()[0]
        started = time.time()
        process = subprocess.Popen(
            [sys.executable, "-m", *README_SWEEP],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        verdict = ended = None
        if first_step_only:
            while (stamp := training_line(cwd)) is None and process.poll() is None:
                time.sleep(0.1)
            process.kill()
            process.wait()
        else:
            for line in process.stdout:
                if verdict is None and line.startswith("trial "):  # the table's header
                    verdict = round(time.time() - started, 2)
            process.wait()
            ended = round(time.time() - started, 2)
            if process.returncode or verdict is None:
                raise SystemExit(f"the sweep exited {process.returncode} without its verdict")
            stamp = training_line(cwd)
        if stamp is None:
            raise SystemExit("the sweep ended before its first step")
        first = datetime.strptime(stamp[1:24], "%Y-%m-%d %H:%M:%S,%f").timestamp() - started
    return {"first_step_s": round(first, 2), "verdict_s": verdict, "exit_s": ended, "load": load}


def training_line(cwd: str) -> str | None:
    """The first trial's "Training N steps" log line (its time stamp first), once written:
    its one run's (t0) or, with several seeds, its first seed's (t0-s0)."""
    for log in sorted(Path(cwd, "multirun").glob("*/*/t0*/__main__.log")):
        for line in log.read_text().splitlines():
            if "] - Training " in line:
                return line
    return None


def sweeps(repeats: int, codes: dict[str, Path], first_step_only: bool) -> None:
    runs: dict[str, list[dict]] = {label: [] for label in codes}
    for round_ in range(repeats):
        for label, code in codes.items():
            runs[label].append(first_sweep(code, first_step_only))
            print(f"run {round_ + 1}/{repeats}, {label}: {runs[label][-1]}", file=sys.stderr)
    result: dict[str, object] = {"command": "python -m " + " ".join(README_SWEEP)}
    for label, done in runs.items():
        result[label] = {
            f"median_{key}": round(statistics.median(r[key] for r in done), 2)
            for key in ("first_step_s", "verdict_s", "exit_s", "load")
            if all(r[key] is not None for r in done)
        } | {"runs": done}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "startup_sweep.json").write_text(
        json.dumps({**result, "machine": machine()}, indent=1) + "\n"
    )
    print(json.dumps(result, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="an older checkout to compare with")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sweep", action="store_true", help="the README's main sweep")
    parser.add_argument("--first-step", action="store_true", help="--sweep: stop at step 1")
    args = parser.parse_args()
    codes = {"this": ROOT, **({"before": args.before.resolve()} if args.before else {})}
    if args.sweep:
        sweeps(args.repeats, codes, args.first_step)
        return
    times: dict[str, dict[str, list[float]]] = {n: {c: [] for c in codes} for n in COMMANDS}
    for round_ in range(args.repeats):
        for name, (command, expected) in COMMANDS.items():
            for label, code in codes.items():
                times[name][label].append(wall(code, command, expected))
        print(f"round {round_ + 1}/{args.repeats} done", file=sys.stderr)
    summary = {
        name: {
            label: {
                "median_s": round(statistics.median(ts), 2),
                "runs_s": [round(t, 2) for t in ts],
            }
            for label, ts in per.items()
        }
        for name, per in times.items()
    }
    for name, per in summary.items():
        if "before" in per:
            ratios = [
                b / t for t, b in zip(times[name]["this"], times[name]["before"], strict=True)
            ]
            per["ratio_before_to_this"] = round(statistics.median(ratios), 2)
            per["ratio_spread"] = [round(min(ratios), 2), round(max(ratios), 2)]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "startup.json").write_text(
        json.dumps({**summary, "machine": machine()}, indent=1) + "\n"
    )
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
