"""Chaos on a shared study: workers on hosts apart (network namespaces, each with its own link
to one PostgreSQL server holding the Optuna study and MLflow's tracking store in two
databases) for 10 minutes, a random worker whose trial is training killed every few seconds
(SIGKILL or SIGTERM, half each) and started again, two server restarts, one host's link cut
silently (dropped packets) past the heartbeat grace and healed once its trials were taken
over, and one host's clock five minutes ahead. The default health rules are on. Then the
chaos stops, the live workers finish, and the same command runs once more. Checked:

- every grid point ended (COMPLETE or PRUNED) exactly once, nothing charged a failure,
  nothing RUNNING in Optuna; no MLflow run RUNNING, one FINISHED training run per point;
- no metric step logged twice in any training run;
- every point's end, final value and curve (each metric at each step) the same as in a sweep
  of the same grid that met no fault (run after the chaos on databases of its own, or read
  back from --reference), within --tolerance (0: bit-identical, as resume is);
- counted: points re-queued, those resumed from a checkpoint, steps trained twice, the cut
  host's results dropped as stale, each trial's clock ahead of the database's.

    python bench/bench_chaos.py [--hosts 4] [--workers 8] [--minutes 10] [--seed 0] [--tag run1]

--hosts 0 runs every worker in the root namespace with a 30 s pause of the whole server in
place of the cut (the earlier benchmark). Needs PostgreSQL's server binaries (apt-get install
postgresql; tests/pg_server.py starts a throwaway server), and for hosts root, iproute2 and
libfaketime (tests/net_hosts.py). Results: bench/results/chaos_<tag>.json; bench/CHAOS.md
reads them.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from machine_info import machine  # bench/ is on the path: this runs as a script

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import net_hosts  # noqa: E402
import point_records as pr  # noqa: E402
from pg_server import started_server  # noqa: E402

from records.sweep import TrialAttr, replicates  # noqa: E402

RESULTS = Path(__file__).parent / "results"
GRID = ["lr=5e-4,1e-3,2e-3,4e-3", "group_size=2,4", "batch_size=2,4"]
TRAINING = ["save_every=3", "eval_every=0", "task.eval_size=16"]
SWEEP = ["hydra.sweeper.heartbeat_interval=3"]  # the default health rules: on
# one run a point, as the recorded rounds ran: racing is not what chaos tests
SWEEP += ["hydra.sweeper.seeds=1"]
SWEEP += ["hydra.sweeper.grace_period=20", "hydra.sweeper.db_retry_seconds=300"]
GRACE_S = 20
PAUSE_S = 30  # longer than the grace: every running trial's heartbeat looks stale at once
CUT, SKEWED = 1, 2  # the host whose link is cut; the host whose clock runs ahead
SKEW_S = 300
CUT_WAIT_S = 120  # the cut waits this long at most for a trial on its host
CUT_BOUND_S = 240  # the link heals once the cut host's trials were taken over, or after this
# 8 workers on 2 cores: one thread each, or torch's threads fight each other.
WORKER_ENV = {"OMP_NUM_THREADS": "1"}


class Workers:
    """Worker slots running the same sweep command; a slot whose worker ended is refilled
    while the chaos lasts. Slot s runs on host s % hosts (none: the root namespace)."""

    def __init__(self, root: Path, server, hosts, args: list[str]) -> None:
        self.root, self.server, self.hosts, self.args = root, server, hosts, args
        self.live: dict[int, subprocess.Popen] = {}
        self.started = 0
        self.exits: Counter = Counter()
        self.logs: dict[int, Path] = {}
        self.all_logs: list[tuple[int | None, Path]] = []  # (host, log) of every worker
        self.stopped_training = 0  # workers a kill stopped with a trial in training

    def host(self, slot: int) -> int | None:
        return slot % self.hosts.n if self.hosts else None

    def urls(self, host: int | None) -> tuple[str, str]:
        if host is None:
            return self.server.database("optuna"), self.server.database("mlflow")
        at = self.hosts.server(host)
        return tuple(net_hosts.url_from(self.server.base_url, at, d) for d in ("optuna", "mlflow"))

    def start(self, slot: int) -> None:
        cwd = self.root / f"w{slot}"
        cwd.mkdir(parents=True, exist_ok=True)
        self.logs[slot] = cwd / f"worker{self.started}.log"
        host = self.host(slot)
        self.all_logs.append((host, self.logs[slot]))
        log = self.logs[slot].open("w")
        storage, tracking = self.urls(host)
        command = [sys.executable, "-m", "sweeper", "-m", f"hydra.sweeper.storage='{storage}'"]
        env = {**os.environ, **WORKER_ENV, "MLFLOW_TRACKING_URI": tracking}
        if host is not None:
            command = [*self.hosts.prefix(host), *command]
            env.update(net_hosts.skewed(SKEW_S) if host == SKEWED else {})
        self.live[slot] = subprocess.Popen(
            [*command, *self.args], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        self.started += 1

    def training(self) -> list[int]:
        """The slots whose worker has a trial in flight (past its start-up, which takes
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
    server at 25% and 65% of the time; at 45% cut one host's link until its trials were
    taken over (with hosts) or pause the server (without). Returns the counts."""
    counts: Counter = Counter()
    began = time.monotonic()
    middle = "cut" if workers.hosts else "pause"
    events = [(0.25, "restart"), (0.45, middle), (0.65, "restart")]
    next_kill = began + rng.uniform(4, 12)
    cut: Cut | None = None
    while (elapsed := time.monotonic() - began) < 60 * minutes:
        for slot in workers.reap():
            workers.start(slot)
        if (
            events
            and elapsed >= events[0][0] * 60 * minutes
            and not _wait_for_cut(workers, events[0], elapsed - events[0][0] * 60 * minutes)
        ):
            _, what = events.pop(0)
            say(f"{elapsed:5.0f} s: {what}")
            if what == "restart":
                server.pg_ctl("restart", "-m", "fast")
            elif what == "pause":
                server.paused(PAUSE_S)
            else:
                cut = Cut(workers, server.database("optuna"))
            counts[f"server_{what}s" if what != "cut" else "links_cut"] += 1
        if cut is not None and cut.over():
            counts.update(cut.heal())
            say(f"{time.monotonic() - began:5.0f} s: healed after {counts['cut_s']:.0f} s")
            cut = None
        training = [s for s in workers.training() if cut is None or workers.host(s) != CUT]
        if time.monotonic() >= next_kill and training:
            slot = rng.choice(training)
            how = rng.choice([signal.SIGKILL, signal.SIGTERM])
            workers.live[slot].send_signal(how)
            counts[f"{how.name}s"] += 1
            next_kill = time.monotonic() + rng.uniform(4, 12)
        time.sleep(0.2)
    if cut is not None:
        counts.update(cut.heal())
    return dict(counts)


def _wait_for_cut(workers: Workers, event: tuple[float, str], late_s: float) -> bool:
    """The cut waits (CUT_WAIT_S at most) for a trial in training on the host it cuts: a cut
    that holds no trial tests no takeover."""
    if event[1] != "cut" or late_s > CUT_WAIT_S:
        return False
    return not any(workers.host(s) == CUT for s in workers.training())


class Cut:
    """Host CUT's link cut: its packets dropped until every trial it was training then was
    taken over (a retry queued in its place, or ended), CUT_BOUND_S at most."""

    def __init__(self, workers: Workers, storage: str) -> None:
        self.workers, self.storage = workers, storage
        running = {t.number for t in pr.trials_of(storage) if t.state.name == "RUNNING"}
        on_host = {n for host, log in workers.all_logs if host == CUT for n in started_trials(log)}
        self.trials = sorted(running & on_host)
        workers.hosts.cut(CUT)
        self.at = time.monotonic()
        say(f"cut host {CUT}'s link; its trials in training: {self.trials}")

    def over(self) -> bool:
        waited = time.monotonic() - self.at
        if waited < GRACE_S:
            return False
        if waited > CUT_BOUND_S:
            return True
        trials = pr.trials_of(self.storage)
        taken = {t.user_attrs.get(TrialAttr.RETRY_OF) for t in trials}
        ended = {t.number for t in trials if t.state.name in ("COMPLETE", "PRUNED")}
        return all(n in taken or n in ended for n in self.trials)

    def heal(self) -> dict:
        self.workers.hosts.heal(CUT)
        return {"cut_s": round(time.monotonic() - self.at), "cut_trials": len(self.trials)}


def trial_lines(log: Path) -> list[tuple[int, str]]:
    """A worker's `[sweep NAME] tN ...` lines as (N, the rest): its trials' starts and ends."""
    lines = log.read_text(errors="replace").splitlines()
    return [(int(m[1]), m[2]) for line in lines if (m := TRIAL_LINE.match(line))]


TRIAL_LINE = re.compile(r"^\[sweep [^\]]+\] t(\d+)\b(.*)$")


def started_trials(log: Path) -> list[int]:
    """The trials a worker started."""
    return [n for n, rest in trial_lines(log) if rest.endswith(" started")]


def was_training(log: Path) -> bool:
    """A trial this worker started has not ended yet (no line of its outcome since): a kill
    before the first start, in the worker's start-up, leaves nothing to recover."""
    running: set[int] = set()
    for n, rest in trial_lines(log):
        (running.add if rest.endswith(" started") else running.discard)(n)
    return bool(running)


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


def reference_records(server, root: Path, command: list[str], workers: int) -> dict:
    """The same grid swept with no fault (workers in the root namespace, databases of their
    own), its points' records. Cached by command: every run of one grid shares it."""
    key = hashlib.sha256(json.dumps(command).encode()).hexdigest()[:12]
    cached = Path(tempfile.gettempdir(), f"grpo-sweeper-chaos-reference-{key}.json")
    if cached.exists():
        say(f"reference: {cached} (the same command's fault-free sweep, run before)")
        return json.loads(cached.read_text())
    storage, tracking = server.database("ref_optuna"), server.database("ref_mlflow")
    say(f"reference: the same grid with no fault, {workers} workers")
    began = time.monotonic()
    processes = []
    for i in range(workers):
        cwd = root / f"ref{i}"
        cwd.mkdir(parents=True)
        processes.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "sweeper",
                    "-m",
                    f"hydra.sweeper.storage={storage}",
                    *command,
                ],
                cwd=cwd,
                env={**os.environ, **WORKER_ENV, "MLFLOW_TRACKING_URI": tracking},
                stdout=(cwd / "worker.log").open("w"),
                stderr=subprocess.STDOUT,
            )
        )
    codes = [p.wait() for p in processes]
    trials = pr.trials_of(storage)
    problems = pr.ended_once(trials, tracking, len({pr.point(t) for t in trials}))
    if any(codes) or problems:
        raise SystemExit(f"the reference sweep failed ({codes}, {problems}): {root}/ref*")
    recorded = pr.records(trials, tracking)
    # JSON keys are strings: curves' steps come back as such either way.
    recorded = json.loads(json.dumps(recorded))
    cached.write_text(json.dumps(recorded) + "\n")
    say(f"reference done in {time.monotonic() - began:.0f} s: {cached}")
    return recorded


def host_facts(workers: Workers, trials: list, storage: str) -> dict:
    """What the hosts apart showed: the cut host's results dropped as stale, and how far
    each host's clock ran ahead of the database's (a trial's end on the worker's clock
    less its last heartbeat on the server's)."""
    ahead = pr.clock_ahead(storage, trials)
    by_host: dict[str, list[float]] = {}
    dropped = 0
    for host, log in workers.all_logs:
        text = log.read_text(errors="replace")
        if host == CUT:
            dropped += text.count("was taken over by another worker")
        seconds = [ahead[n] for n in started_trials(log) if n in ahead]
        by_host.setdefault(str(host), []).extend(seconds)
    return {
        "cut_host": CUT,
        "cut_host_results_dropped_as_taken_over": dropped,
        "skewed_host": SKEWED,
        "skew_s": SKEW_S,
        "clock_ahead_s_by_host": {
            h: [min(v), max(v)] if v else None for h, v in sorted(by_host.items())
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=4, help="network namespaces; 0: none")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tag", default="run")
    parser.add_argument("--note", default="")
    parser.add_argument("--max-steps", type=int, default=60, help="per trial: the grid's length")
    parser.add_argument("--reference-workers", type=int, default=4)
    parser.add_argument("--tolerance", type=float, default=0.0, help="0: bit-identical")
    args = parser.parse_args()
    if args.hosts and (why := net_hosts.unavailable() or net_hosts.faketime_missing()):
        raise SystemExit(f"--hosts {args.hosts}: {why}; --hosts 0 runs on one host")
    rng = random.Random(args.seed)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))  # the server is stopped too
    points = 1
    for axis in GRID:
        points *= len(axis.split("=", 1)[1].split(","))
    command = [*GRID, f"max_steps={args.max_steps}", *TRAINING, *SWEEP]
    root = Path(tempfile.mkdtemp(prefix="grpo-sweeper-chaos-"))
    with contextlib.ExitStack() as stack:
        hosts = stack.enter_context(net_hosts.hosts_apart(args.hosts)) if args.hosts else None
        listen = ("127.0.0.1", *(hosts.servers() if hosts else ()))
        server = stack.enter_context(
            started_server(
                listen, hosts.subnet() if hosts else "", tuple(net_hosts.SERVER_KEEPALIVES)
            )
        )
        storage, tracking = server.database("optuna"), server.database("mlflow")
        workers = Workers(root, server, hosts, command)
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
        trials = pr.trials_of(storage)
        problems = pr.ended_once(trials, tracking, points)
        if problems:  # recorded with the rest: which points, which states
            dump_trials(trials, root / "trials.json")  # the server goes with its records
        reference = reference_records(server, root, command, args.reference_workers)
        chaotic = json.loads(json.dumps(pr.records(trials, tracking)))
        same = pr.compared(reference, chaotic, args.tolerance)
        result = {
            "hosts": args.hosts,
            "workers": args.workers,
            "minutes_of_chaos": args.minutes,
            "seed": args.seed,
            "points": points,
            "command": command,
            "pause_s": None if hosts else PAUSE_S,
            "events": counts,
            "worker_starts": workers.started,
            "kills_that_stopped_a_training_worker": workers.stopped_training,
            "workers_killed_after_the_drain_bound": unfinished,
            "worker_exit_codes": {str(k): v for k, v in workers.exits.items()},
            "costs": retries(trials),
            "ends": dict(Counter(r["state"] for r in chaotic.values())),
            "hosts_apart": host_facts(workers, trials, storage) if hosts else None,
            "invariants": {
                "every_point_ended_once": problems,
                "metric_steps_logged_twice": pr.metric_steps_logged_twice(tracking),
                "differences_from_the_reference": same.pop("differences"),
            },
            "reference": same,
            "wall_s": round(wall, 1),
            "machine": machine(args.note),
        }
    result["hosts_left_behind"] = hosts.left_behind() if hosts else []
    say(json.dumps(result, indent=1))
    say(f"worker logs: {root}")
    bad = any(result["invariants"].values()) or result["hosts_left_behind"]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"chaos_{args.tag}.json").write_text(json.dumps(result, indent=1) + "\n")
    if bad:
        raise SystemExit("invariants broken: see the result file")


if __name__ == "__main__":
    main()
