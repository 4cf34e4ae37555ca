"""Truths for the small grids a researcher types first (issue 72), recorded in the curve
library's format (bench/record_curves.py, whose record() makes each run) with a group_size
axis, one JSON file a run, under bench/results/small_grids/.

    python bench/record_small_grids.py [--part calibration|heldout|all] [--seeds 24]
        [--grids readme lr4] [--list]

The grids, on the tiny default model and the default task (addition):

- `readme`: the README's command, `group_size=4,8 lr=1e-3,2e-3`, 50 steps (the default).
- `lr4`: `lr=5e-4,1e-3,2e-3,4e-3 max_steps=30` (group_size 8, the default).

The split was fixed before any run was recorded: a run's part is its seed's parity
(record_curves.part_of): the even seeds 0-22 calibrate, the odd seeds 1-23 are held out, and
the calibration part is recorded first (`--part calibration`, the default), the held-out part
only once a policy is chosen (`--part heldout`). Seeds are the sweeper's (`seeds_of(0, N)`).
The eval runs every 10 steps, a sweep's default cadence (bench_cost.py's --eval-every 10
replays it exactly), greedy decoding off as in the library. Resumable run by run, as
record_curves.py: a rerun skips the runs whose file is there.

Recorded niced on the shared 2-core host with OMP_NUM_THREADS=1 (two torch threads against
other jobs ran 10-40x slower; the first three runs' final values were the same with both):

    OMP_NUM_THREADS=1 nice -n 19 python bench/record_small_grids.py --part calibration
"""

from __future__ import annotations

import argparse
from pathlib import Path

import record_curves as rc  # bench/ is on the path: this runs as a script

from sweeper.sweep.flights import seeds_of

OUT = rc.ROOT / "bench" / "results" / "small_grids"
GRIDS = {  # name: (task, max_steps, [(group_size, lr), ...]) in the order a sweep lists them
    "readme": ("addition", 50, [(g, lr) for g in (4, 8) for lr in (1e-3, 2e-3)]),
    "lr4": ("addition", 30, [(8, lr) for lr in (5e-4, 1e-3, 2e-3, 4e-3)]),
}
EVAL_EVERY = 10


def run_id(grid: str, task: str, group_size: int, lr: float, seed: int) -> str:
    return f"tiny-{task}-{grid}-gs{group_size}-lr{lr:g}-seed{seed}"


def planned(part: str, seeds: int, grids: list[str]) -> list[dict]:
    """Seed by seed, each seed every grid's points: a campaign cut short covers every point
    at its first seeds."""
    runs = []
    for seed in seeds_of(0, seeds):
        if part not in ("all", rc.part_of(seed)):
            continue
        for grid in grids:
            task, steps, points = GRIDS[grid]
            for group_size, lr in points:
                runs.append(
                    {
                        "model": "tiny",
                        "task": task,
                        "lr": lr,
                        "seed": seed,
                        "group_size": group_size,
                        "grid": grid,
                        "max_steps": steps,
                    }
                )
    return runs


def overrides(run: dict, args: argparse.Namespace) -> list[str]:
    """record_curves' overrides at this run's steps, and its group_size."""
    base = argparse.Namespace(steps=run["max_steps"], eval_every=EVAL_EVERY)
    return [*PLAIN_OVERRIDES(run, base), f"group_size={run['group_size']}"]


PLAIN_OVERRIDES = rc.overrides


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=[rc.CALIBRATION, rc.HELDOUT, "all"], default=rc.CALIBRATION)
    p.add_argument("--seeds", type=int, default=24, help="seeds_of(0, N); parity picks the part")
    p.add_argument("--grids", nargs="+", choices=sorted(GRIDS), default=list(GRIDS))
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--list", action="store_true", help="print the plan and what is done")
    args = p.parse_args(argv)
    rc.overrides = overrides  # record() builds each run's config through it
    runs = planned(args.part, args.seeds, args.grids)
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = []
    for run in runs:
        name = run_id(run["grid"], run["task"], run["group_size"], run["lr"], run["seed"])
        steps_args = argparse.Namespace(steps=run["max_steps"], eval_every=EVAL_EVERY)
        jobs.append((args.out / f"{name}.json", run, steps_args))
    rc.campaign(jobs, args.list)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
