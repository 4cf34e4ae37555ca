"""How long a command takes to answer when it does no training: a bad input, or --help.

    python bench/bench_startup.py [--before /tmp/before] [--repeats 5]

Each command runs in a fresh process in an empty directory, from this checkout and, with
--before, from an older one (its root put first on PYTHONPATH), alternated: this, before,
this, before, ... Per command and checkout: the median wall time and every round's. A bad
input is what a user meets most often before a sweep, and the bad-input tests run it 20 times.
Nothing here asserts a timing. Results: bench/results/startup.json.
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
from pathlib import Path

from machine_info import machine  # bench/ is on the path: this runs as a script

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="an older checkout to compare with")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    codes = {"this": ROOT, **({"before": args.before.resolve()} if args.before else {})}
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
