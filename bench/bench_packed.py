"""Packed trials against one trial at a time: trial-steps per second on the tiny model.

    python bench/bench_packed.py --rounds 3 --note "shared host"   # bench/results/packed.json

For each K in --ks, three arms: `solo` trains K trials one after another (trainer.run.train),
each alone on the model; `packed` trains the same K trials at once on one base model
(trainer.packed.host.train_packed); `processes` trains them at once in K processes of their
own (--threads each), started together once every one has loaded (the wall time runs from
that start to the end of the last one's training; the CPU time is theirs summed). The trials
differ by seed and lr, as a sweep's do. Each arm runs in fresh processes (`--child`), which
time only the training calls (model load and the baseline and final evals included, the
interpreter's start-up and imports not). Arms alternate within each round, their order
reversed every other round (A B C, C B A, ...). Shapes: the default batch (32 problems x 8
rollouts), a small one (4 x 4), SmolLM2's. The figures: K x STEPS trial-steps over the arm's
wall seconds, and over its CPU seconds (process time: steadier on a shared host, where wall
time includes waiting for the CPU); packed / solo and processes / solo per round, then their
medians. Nothing asserts a timing; PACKED.md quotes the medians and spreads.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine_info import machine  # bench/ is on the path: this runs as a script

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parents[1]
STEPS = 10  # --steps
SHAPES = {  # each trial: STEPS steps, the baseline and final evals
    "default": [],  # 32 problems x 8 rollouts a step, 400 eval problems
    "small": ["batch_size=4", "group_size=4", "task.eval_size=16"],
    # SmolLM2-135M-Instruct (tests/real_model.py builds it), bench/THREADS.md's shape
    "smollm2": ["batch_size=4", "group_size=4", "max_tokens=16", "task.eval_size=16"],
}
ARMS = ("solo", "packed", "processes")
LRS = ["1e-3", "2e-3", "3e-3", "5e-3", "7e-3", "1e-2", "1.5e-3", "4e-3"]


def child(arm: str, k: int, shape: str, threads: int, only: int | None = None) -> dict:
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import compose_conf

    from trainer.packed.host import train_packed
    from trainer.run.train import train

    torch.set_num_threads(threads)
    model = []
    if shape == "smollm2":
        from real_model import smollm2_dir

        model = [f"model.path={smollm2_dir()}"]
    with tempfile.TemporaryDirectory() as scratch:
        cfgs = [
            compose_conf(
                f"output_dir={scratch}/t{i}",
                *(f"max_steps={STEPS}", "eval_every=0", *model, *SHAPES[shape]),
                *(f"seed={i}", f"lr={LRS[i]}"),
            )
            for i in range(k)
        ]
        if only is not None:  # one of the `processes` arm's: wait for the others to load
            cfgs = [cfgs[only]]
            print("ready", flush=True)
            sys.stdin.readline()
        start, cpu = time.perf_counter(), time.process_time()
        if arm in ("solo", "one"):
            for cfg in cfgs:
                train(cfg)
        else:
            failed = [r for r in train_packed(cfgs) if isinstance(r, BaseException)]
            if failed:
                raise failed[0]
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {
        "ended_at": time.time(),  # the `processes` arm's wall time ends at its last child's
        **{"arm": arm, "k": k, "shape": shape, "seconds": seconds, "cpu_seconds": cpu},
        "trial_steps_per_s": k * STEPS / seconds,
        "trial_steps_per_cpu_s": k * STEPS / cpu,
        # the process's peak resident memory (Linux: KiB), the interpreter and imports included
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run_child(arm: str, k: int, shape: str, threads: int) -> dict:
    command = [sys.executable, __file__, "--child", arm, "--k", str(k), "--shape", shape]
    command += ["--threads", str(threads), "--steps", str(STEPS)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{arm} K={k}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_processes(k: int, shape: str, threads: int) -> dict:
    """K trials at once, a process each, started together once all have loaded."""
    command = [sys.executable, __file__, "--child", "one", "--k", str(k), "--shape", shape]
    command += ["--threads", str(threads), "--steps", str(STEPS)]
    children = [
        subprocess.Popen(
            [*command, "--only", str(i)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # progress bars: an unread pipe would fill and block
            text=True,
            cwd=ROOT,
        )
        for i in range(k)
    ]
    for one in children:  # each says it has loaded: then all start at once
        if one.stdout.readline().strip() != "ready":
            raise RuntimeError(f"processes K={k}: a child ended before it loaded")
    start = time.time()
    for one in children:
        one.stdin.write("go\n")
        one.stdin.flush()
    outs = [json.loads(one.communicate()[0].strip().splitlines()[-1]) for one in children]
    seconds = max(o["ended_at"] for o in outs) - start  # not their exits' teardown
    if any(one.returncode for one in children):
        raise RuntimeError(f"processes K={k}: a child failed")
    cpu = sum(o["cpu_seconds"] for o in outs)
    return {
        **{"arm": "processes", "k": k, "shape": shape, "seconds": seconds, "cpu_seconds": cpu},
        "trial_steps_per_s": k * STEPS / seconds,
        "trial_steps_per_cpu_s": k * STEPS / cpu,
        "peak_rss_mib": sum(o["peak_rss_mib"] for o in outs),  # the K processes' together
    }


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summary(runs: list[dict], shapes: list[str], ks: list[int]) -> dict:
    """Per shape and K: each arm's rates (wall and CPU), and packed / solo and processes /
    solo, paired by round."""
    out: dict = {}
    for shape in shapes:
        for k in ks:
            cell = {}
            for rate in ("trial_steps_per_s", "trial_steps_per_cpu_s"):
                by_arm = {
                    arm: [
                        r[rate] for r in runs if (r["shape"], r["k"], r["arm"]) == (shape, k, arm)
                    ]
                    for arm in ARMS
                }
                cell[rate] = {a: spread(v) for a, v in by_arm.items() if v}
                for arm in ("packed", "processes"):
                    if by_arm[arm] and by_arm["solo"]:
                        ratios = [a / s for a, s in zip(by_arm[arm], by_arm["solo"], strict=True)]
                        cell[rate][f"{arm} / solo"] = spread(ratios)
            out[f"{shape} K={k}"] = cell
    return out


def main() -> None:
    global STEPS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ks", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--shapes", nargs="+", default=["default", "small"], choices=list(SHAPES))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=STEPS, help="training steps per trial")
    parser.add_argument("--out", default=str(RESULTS / "packed.json"))
    parser.add_argument("--note", default="", help="how the host was used beside the bench")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--child", choices=["solo", "packed", "one"], help=argparse.SUPPRESS)
    parser.add_argument("--k", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--only", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--shape", choices=list(SHAPES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    STEPS = args.steps
    if args.child:
        print(json.dumps(child(args.child, args.k, args.shape, args.threads, args.only)))
        return
    runs = []
    for round_ in range(args.rounds):
        for shape in args.shapes:
            for k in args.ks:
                arms = args.arms if round_ % 2 == 0 else args.arms[::-1]
                for arm in arms:
                    if arm == "processes":
                        run = run_processes(k, shape, args.threads)
                    else:
                        run = run_child(arm, k, shape, args.threads)
                    runs.append({**run, "round": round_})
                    print(json.dumps(runs[-1]), flush=True)
    result = {
        "machine": machine(args.note),
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(sys.argv),
        "steps": STEPS,
        "shapes": {name: SHAPES[name] for name in args.shapes},
        "threads": args.threads,
        "summary": summary(runs, args.shapes, args.ks),
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
