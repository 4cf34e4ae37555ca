"""Chaos on a shared study: 8 workers on one PostgreSQL server (the Optuna study and MLflow's
tracking store in two databases of it) for 10 minutes, a random worker whose trial is training
killed every few seconds (SIGKILL or SIGTERM, half each) and started again, two server
restarts and one pause of the whole server (every postgres process SIGSTOPped) for longer than
the heartbeat grace. Then the chaos stops, the live workers finish, and the same command runs
once more. Checked:

- every grid point COMPLETE exactly once, nothing charged a failure, nothing RUNNING in Optuna;
- no MLflow run RUNNING, one FINISHED training run per point;
- no metric step logged twice in any training run;
- counted (not checked): points re-queued, those resumed from a checkpoint, steps trained twice.

    python bench/bench_chaos.py [--workers 8] [--minutes 10] [--seed 0] [--tag run1]

Needs PostgreSQL's server binaries (apt-get install postgresql; tests/pg_server.py starts a
throwaway server). Results: bench/results/chaos_<tag>.json; bench/CHAOS.md reads them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from machine_info import machine  # bench/ is on the path: this runs as a script

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from pg_server import started_server  # noqa: E402
from test_database_faults import assert_every_point_complete_once, trial_runs  # noqa: E402

from records.sweep import (
    TrialAttr,  # noqa: E402
    replicates,  # noqa: E402
)

RESULTS = Path(__file__).parent / "results"
GRID = ["lr=1e-3,2e-3,3e-3,4e-3", "group_size=2,4", "batch_size=2,4"]
TRAINING = ["save_every=3", "eval_every=0", "task.eval_size=16"]
SWEEP = ["hydra.sweeper.health=[]", "hydra.sweeper.heartbeat_interval=3"]
SWEEP += ["hydra.sweeper.grace_period=20", "hydra.sweeper.db_retry_seconds=300"]
PAUSE_S = 30  # longer than the grace: every running trial's heartbeat looks stale at once
# 8 workers on 2 cores: one thread each, or torch's threads fight each other.
WORKER_ENV = {"OMP_NUM_THREADS": "1"}
TRAINING_BEGAN = "] - Training "  # trainer/run/train.py's first line of a run


class Workers:
    """Worker slots running the same sweep command; a slot whose worker ended is refilled
    while the chaos lasts."""

    def __init__(self, root: Path, storage: str, tracking: str, args: list[str]) -> None:
        self.root, self.storage, self.tracking, self.args = root, storage, tracking, args
        self.live: dict[int, subprocess.Popen] = {}
        self.started = 0
        self.exits: Counter = Counter()
        self.logs: dict[int, Path] = {}
        self.stopped_training = 0  # workers a kill stopped with a trial in training

    def start(self, slot: int) -> None:
        cwd = self.root / f"w{slot}"
        cwd.mkdir(parents=True, exist_ok=True)
        self.logs[slot] = cwd / f"worker{self.started}.log"
        log = self.logs[slot].open("w")
        command = [sys.executable, "-m", "sweeper", "-m", f"hydra.sweeper.storage={self.storage}"]
        self.live[slot] = subprocess.Popen(
            [*command, *self.args],
            cwd=cwd,
            env={**os.environ, **WORKER_ENV, "MLFLOW_TRACKING_URI": self.tracking},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.started += 1

    def training(self) -> list[int]:
        """The slots whose worker has a trial in training (past its start-up, which takes
        20-60 s with 8 workers on 2 cores)."""
        return sorted(s for s in self.live if was_training(self.logs[s]))

    def reap(self) -> list[int]:
        """The slots whose worker ended (their exit codes counted)."""
        ended = [slot for slot, p in self.live.items() if p.poll() is not None]
        for slot in ended:
            code = self.live.pop(slot).returncode
            self.exits[code] += 1
            self.stopped_training += code != 0 and was_training(self.logs[slot])
        return ended


def chaos(workers: Workers, server, minutes: float, rng: random.Random) -> dict:
    """Kill a random worker in training every 4-12 s and refill its slot; restart the
    server at 25% and 65% of the time, pause it at 45%. Returns the counts."""
    counts = Counter()
    began = time.monotonic()
    events = [(0.25, "restart"), (0.45, "pause"), (0.65, "restart")]
    next_kill = began + rng.uniform(4, 12)
    while (elapsed := time.monotonic() - began) < 60 * minutes:
        for slot in workers.reap():
            workers.start(slot)
        if events and elapsed >= events[0][0] * 60 * minutes:
            _, what = events.pop(0)
            say(f"{elapsed:5.0f} s: server {what}")
            if what == "restart":
                server.pg_ctl("restart", "-m", "fast")
            else:
                server.paused(PAUSE_S)
            counts[f"server_{what}s"] += 1
        if time.monotonic() >= next_kill and workers.training():
            slot = rng.choice(workers.training())
            how = rng.choice([signal.SIGKILL, signal.SIGTERM])
            workers.live[slot].send_signal(how)
            counts[f"{how.name}s"] += 1
            next_kill = time.monotonic() + rng.uniform(4, 12)
        time.sleep(0.2)
    return dict(counts)


def was_training(log: Path) -> bool:
    """A trial's training had begun in this worker (its log says so): a kill before that, in
    the worker's start-up, leaves nothing to recover."""
    return TRAINING_BEGAN in log.read_text(errors="replace")


def drain(workers: Workers, timeout_s: float) -> int:
    """The chaos is over: the live workers finish (nothing refilled). Returns how many were
    still going after timeout_s (then killed)."""
    deadline = time.monotonic() + timeout_s
    while workers.live and time.monotonic() < deadline:
        workers.reap()
        time.sleep(1)
    unfinished = len(workers.live)
    for process in workers.live.values():  # still going past the bound: said in the result
        process.kill()
        process.wait()
    workers.reap()
    return unfinished


def metric_steps_logged_twice(tracking: str) -> list[str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking)
    twice = []
    for run in trial_runs(tracking):
        for key in run.data.metrics:
            steps = Counter(m.step for m in client.get_metric_history(run.info.run_id, key))
            twice += [f"{run.info.run_name} {key} step {s}" for s, n in steps.items() if n > 1]
    return twice


def runs_left_running(tracking: str) -> list[str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking)
    everything = client.search_runs([client.get_experiment_by_name("grpo").experiment_id])
    return [r.info.run_name for r in everything if r.info.status == "RUNNING"]


def retries(trials: list) -> dict:
    """What the chaos cost: trials lost and queued again, how many resumed from a checkpoint,
    and the steps trained twice (a lost copy's steps past the checkpoint its retry took)."""
    by_number = {t.number: t for t in trials}
    requeued = [t for t in trials if TrialAttr.RETRY_OF in t.user_attrs]
    resumed, retrained = 0, 0
    for retry in requeued:
        lost = by_number[retry.user_attrs[TrialAttr.RETRY_OF]]
        lost_steps = max((r.steps_run for r in replicates(lost)), default=0)
        # none recorded: the retry itself was lost before its job began
        for seed in replicates(retry):
            resumed += seed.resumed_from_step is not None
            retrained += max(0, lost_steps - (seed.resumed_from_step or 0))
    lost_in_a_row = max((t.user_attrs.get(TrialAttr.LOST_IN_A_ROW, 0) for t in trials), default=0)
    return {
        "trials": len(trials),
        "requeued": len(requeued),
        "resumed_from_checkpoint": resumed,
        "steps_retrained_at_least": retrained,
        "most_losses_of_one_point": lost_in_a_row,
    }


def load_trials(storage: str) -> list:
    import optuna

    (name,) = optuna.get_all_study_names(storage)
    return optuna.load_study(study_name=name, storage=storage).trials


def dump_trials(trials: list, path: Path) -> None:
    """Every trial as the study held it, beside the worker logs, to read what went wrong."""
    rows = [
        {
            "number": t.number,
            "state": t.state.name,
            "params": t.params,
            "user_attrs": t.user_attrs,
            "system_attrs": t.system_attrs,
        }
        for t in trials
    ]
    path.write_text(json.dumps(rows, indent=1, default=str) + "\n")
    say(f"every trial: {path}")


def say(line: str) -> None:
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tag", default="run")
    parser.add_argument("--note", default="")
    parser.add_argument("--max-steps", type=int, default=60, help="per trial: the grid's length")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))  # the server is stopped too
    points = 1
    for axis in GRID:
        points *= len(axis.split("=", 1)[1].split(","))
    root = Path(tempfile.mkdtemp(prefix="grpo-sweeper-chaos-"))
    with started_server() as server:
        storage, tracking = server.database("optuna"), server.database("mlflow")
        workers = Workers(
            root, storage, tracking, [*GRID, f"max_steps={args.max_steps}", *TRAINING, *SWEEP]
        )
        for slot in range(args.workers):
            workers.start(slot)
        began = time.monotonic()
        try:
            counts = chaos(workers, server, args.minutes, rng)
            say(f"chaos over after {time.monotonic() - began:.0f} s: {counts}; draining")
            unfinished = drain(workers, timeout_s=900)
            workers.start(0)  # the same command once more
            say(f"the same command once more ({unfinished} workers were still going)")
            unfinished += drain(workers, timeout_s=900)
        finally:
            for process in workers.live.values():
                process.kill()
        wall = time.monotonic() - began
        try:
            trials = assert_every_point_complete_once(storage, tracking, points)
            complete_once = "yes"
        except AssertionError as e:  # recorded with the rest: which points, which states
            trials, complete_once = load_trials(storage), f"NO: {str(e)[:3000]}"
            dump_trials(trials, root / "trials.json")  # the server goes with its records
        result = {
            "workers": args.workers,
            "minutes_of_chaos": args.minutes,
            "seed": args.seed,
            "points": points,
            "command": [*GRID, f"max_steps={args.max_steps}", *TRAINING, *SWEEP],
            "pause_s": PAUSE_S,
            "events": counts,
            "worker_starts": workers.started,
            "kills_that_stopped_a_training_worker": workers.stopped_training,
            "workers_killed_after_the_drain_bound": unfinished,
            "worker_exit_codes": {str(k): v for k, v in workers.exits.items()},
            "costs": retries(trials),
            "invariants": {
                "every_point_complete_once": complete_once,
                "mlflow_runs_running": runs_left_running(tracking),
                "metric_steps_logged_twice": metric_steps_logged_twice(tracking),
            },
            "wall_s": round(wall, 1),
            "machine": machine(args.note),
        }
    say(json.dumps(result, indent=1))
    say(f"worker logs: {root}")
    held = result["invariants"]
    bad = held["every_point_complete_once"] != "yes" or any(
        held[k] for k in held if k != "every_point_complete_once"
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"chaos_{args.tag}.json").write_text(json.dumps(result, indent=1) + "\n")
    if bad:
        raise SystemExit("invariants broken: see the result file")


if __name__ == "__main__":
    main()
