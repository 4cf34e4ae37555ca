"""The recorded-curve library: whole runs, pruning off, every step's metrics and a dense
held-out eval, one JSON file a run (bench/HEALTH.md, "Recorded-curve library"). One campaign
format for the health rules' error rates and the verdict/forecast replays.

    python bench/record_curves.py [--model tiny|smollm2] [--part calibration|heldout|all]
        [--tasks addition addition_length] [--lrs 3e-4 2e-3 ...] [--seeds 12] [--steps 50]
        [--eval-every 2] [--dense-until 10] [--from-seed N] [--out bench/results/curves]
        [--list]

Resumable run by run: a run's file is written when it ends and a rerun of the same command
skips the runs whose file is there. Seeds are the sweeper's (`seeds_of(0, n)`); a run's part
(calibration or held-out) is fixed by its seed's parity before any result is seen, and the
held-out part is meant to be recorded only after the rules are frozen (`--part heldout`).
Training never sees the eval: it samples on a forked RNG (trainer/run/train.py, tested in
tests/test_curve_library.py), so dropping evals replays any sparser `eval_every` exactly.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from machine_info import machine  # bench/ is on the path: this runs as a script

import trainer  # noqa: F401  (registers the config schemas)
from sweeper.sweep.flights import seeds_of
from trainer.run.health import HealthMonitor
from trainer.run.train import train

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")
OUT = ROOT / "bench" / "results" / "curves"
FORMAT = 1
CALIBRATION, HELDOUT = "calibration", "heldout"
# The held-out objective a label reads: correctness where the training reward can be gamed.
HELDOUT_METRIC = {"addition_length": "eval/reward/exact_match"}
DEFAULT_METRIC = "eval/reward/mean"
MODELS = {  # the overrides that make each model's runs (the tiny model: the default conf)
    "tiny": [],
    "smollm2": ["batch_size=8", "group_size=4", "max_tokens=16", "temperature=0.7"],
}
MODEL_TASKS = {"tiny": ["addition", "addition_length"], "smollm2": ["arithmetic"]}
MODEL_LRS = {
    "tiny": [3e-4, 1e-3, 2e-3, 3e-3, 5e-3, 7e-3, 1e-2, 1.5e-2, 2e-2, 3e-2],
    "smollm2": [1e-4, 1e-3, 1e-2],
}


def part_of(seed: int) -> str:
    """Decided by the run's seed alone, before any result: even calibrates, odd judges."""
    return CALIBRATION if seed % 2 == 0 else HELDOUT


def run_id(model: str, task: str, lr: float, seed: int) -> str:
    return f"{model}-{task}-lr{lr:g}-seed{seed}"


def planned(args: argparse.Namespace) -> list[dict]:
    """The campaign's runs in the order they are recorded: seed by seed, each seed lr by lr
    across the tasks, so a campaign cut short covers both tasks at its first seeds."""
    runs = []
    for seed in seeds_of(0, args.seeds):
        if args.part not in ("all", part_of(seed)) or seed < args.from_seed:
            continue
        for lr in args.lrs or MODEL_LRS[args.model]:
            for task in args.tasks or MODEL_TASKS[args.model]:
                runs.append({"model": args.model, "task": task, "lr": lr, "seed": seed})
    return runs


def overrides(run: dict, args: argparse.Namespace) -> list[str]:
    model = list(MODELS[run["model"]])
    if run["model"] == "smollm2":
        sys.path.insert(0, str(ROOT / "tests"))
        from real_model import smollm2_dir

        model.append(f"model.path={smollm2_dir()}")
    return [
        *model,
        f"task={run['task']}",
        f"lr={run['lr']}",
        f"seed={run['seed']}",
        f"max_steps={args.steps}",
        f"eval_every={args.eval_every}",
        "eval_greedy=false",  # no rule reads it; half the eval's cost
    ]


# Where the real model was built differs by machine; the file names what it is instead.
BUILT_MODEL = "model.path=<SmolLM2-135M-Instruct, built by tests/real_model.py>"


def recorded(override: str) -> str:
    """An override as the run's file keeps it: no machine's path."""
    return BUILT_MODEL if override.startswith("model.path=") else override


def compact(value: object) -> object:
    """A metric as JSON: 5 significant digits; NaN/inf as strings."""
    if isinstance(value, float):
        return float(f"{value:.5g}") if math.isfinite(value) else str(value)
    return value


class EvalsAsked(HealthMonitor):
    """No rules (the recording prunes nothing); asks for an eval at every step up to `until`,
    where a trainer evaluating less often may run one on demand (HealthMonitor.wants_eval:
    before its first scheduled eval), so a replay at any cadence finds it recorded."""

    def __init__(self, until: int) -> None:
        super().__init__([])
        self.until = until

    def wants_eval(self, step: int, metrics: dict) -> bool:
        return 0 < step <= self.until


def record(run: dict, args: argparse.Namespace, path: Path) -> dict:
    steps: dict[str, dict] = {}
    started = time.perf_counter()

    class Reporter:  # trainer.run.train.Reporter: every step's metrics
        monitor = EvalsAsked(args.dense_until)

        def report(self, step: int, metrics: dict) -> None:
            steps[str(step)] = {k: compact(v) for k, v in sorted(metrics.items())}

    load_before = os.getloadavg()[0]
    error = None
    with (
        initialize_config_dir(config_dir=CONF, version_base="1.3"),
        tempfile.TemporaryDirectory() as tmp,
    ):
        cfg = compose("config", overrides=[f"output_dir={tmp}", *overrides(run, args)])
        try:
            train(cfg, Reporter())
        except FloatingPointError as e:  # a run that blew up: its curve ends there
            error = str(e)
        eval_size = int(cfg.task.eval_size)
    wall = time.perf_counter() - started
    return {
        "format": FORMAT,
        "run": path.stem,
        "part": part_of(run["seed"]),
        **run,
        "heldout_metric": HELDOUT_METRIC.get(run["task"], DEFAULT_METRIC),
        "eval_size": eval_size,
        "eval_every": args.eval_every,
        "dense_until": args.dense_until,
        "overrides": [recorded(o) for o in overrides(run, args)],
        "error": error,
        "wall_s": round(wall, 1),
        "machine": machine(
            f"shared host, nice {os.nice(0)}, {torch.get_num_threads()} torch threads; 1-min "
            f"load average {load_before:.1f} before the run, {os.getloadavg()[0]:.1f} after"
        ),
        "steps": steps,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS), default="tiny")
    p.add_argument("--part", choices=[CALIBRATION, HELDOUT, "all"], default=CALIBRATION)
    p.add_argument("--tasks", nargs="+", help="conf/task names (default: the model's)")
    p.add_argument("--lrs", nargs="+", type=float, help="default: the model's range")
    p.add_argument("--seeds", type=int, default=12, help="seeds_of(0, N); parity picks the part")
    p.add_argument(
        "--from-seed", type=int, default=0, help="only seeds from this one (a batch after a freeze)"
    )
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=2)
    p.add_argument(
        "--dense-until",
        type=int,
        default=10,
        help="also evaluate every step up to this one (where an eval on demand may fall)",
    )
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--list", action="store_true", help="print the plan and what is done")
    args = p.parse_args(argv)
    if args.steps < 1 or args.eval_every < 1:
        p.error(f"--steps={args.steps} --eval-every={args.eval_every}: both must be >= 1")
    runs = planned(args)
    args.out.mkdir(parents=True, exist_ok=True)
    campaign([(args.out / f"{run_id(**run)}.json", run, args) for run in runs], args.list)
    return 0


def campaign(jobs: list[tuple[Path, dict, argparse.Namespace]], listing: bool) -> None:
    """Record each (file, run, its steps' settings) in turn, skipping a run whose file is
    there: a rerun of the same command resumes. `listing`: only say what is done."""
    for i, (path, run, args) in enumerate(jobs, 1):
        counter = f"[{i}/{len(jobs)}]"
        if path.exists():
            print(f"{counter} {path.stem}: done, skipped", flush=True)
        elif listing:
            print(f"{counter} {path.stem}: to record", flush=True)
        else:
            record_to(path, run, args, counter)


def record_to(path: Path, run: dict, args: argparse.Namespace, counter: str) -> None:
    """Record one run into `path`, whole or absent (a killed run is recorded again), and say
    its time and final held-out value."""
    data = record(run, args, path)
    tmp = path.with_suffix(".partial")
    tmp.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    tmp.rename(path)
    last = data["steps"][max(data["steps"], key=int)]
    print(
        f"{counter} {path.stem}: {data['wall_s']:.0f} s, final "
        f"{data['heldout_metric']}={last.get(data['heldout_metric'])}",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
