"""A sweep spread over hosts apart: four workers, each in a network namespace of its own with
its own link to the PostgreSQL server (tests/net_hosts.py). One host's link is cut silently
while its trial trains, past the heartbeat grace: the trial is taken over on another host,
and when the link heals the cut-off worker drops its stale result. Another host's clock runs
five minutes ahead: staleness is judged on the database's clock, so it takes over nothing
and nothing of its is taken over. Then every point ended once, with the same final value and
the same curve, step by step, as a sweep of the same grid that met no fault (run beside it,
in the root namespace, on databases of its own).

Everything is coordinated by what the workers write (log lines) and the study's rows, never
by waiting out a grace."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import one_seed_unless_named
from mlflow.tracking import MlflowClient
from net_hosts import SERVER_KEEPALIVES, faketime_missing, hosts_apart, skewed, unavailable
from net_hosts import url_from as host_url
from pg_server import started_server
from point_records import (
    clock_ahead,
    compared,
    ended_once,
    metric_steps_logged_twice,
    records,
    trials_of,
)

from records.metrics import REWARD
from records.sweep import Tag, TrialAttr

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

HOSTS = 4
CUT, SKEWED = 1, 2  # the host whose link is cut; the host whose clock runs ahead
SKEW_S = 300
GRID = ["lr=1e-3,2e-3", "group_size=2,4"]  # 4 points: one a worker
POINTS = 4
# Trials long enough that a cut lands in training; a grace short enough to pass soon.
TRAINING = ["max_steps=12", "save_every=3", "eval_every=0", "task.eval_size=16"]
SWEEP = ["hydra.sweeper.heartbeat_interval=1", "hydra.sweeper.grace_period=10"]
SWEEP += ["hydra.sweeper.db_retry_seconds=120"]
TIMEOUT_S = 1200  # a bound for a failing run: a loaded 2-core host takes minutes to start


def until(condition, what: str, workers: list, timeout: float = TIMEOUT_S) -> None:
    """Wait for a state the workers or the study show; fail with the logs if it never comes
    or a worker fails first."""
    deadline = time.monotonic() + timeout
    while not condition():
        failed = [w for w in workers if w.process.poll() not in (None, 0)]
        late = time.monotonic() > deadline
        assert not (failed or late), f"{what}:\n" + "\n".join(w.tail() for w in failed or workers)
        time.sleep(0.1)


class Worker:
    def __init__(self, command: list[str], cwd: Path, env: dict[str, str]) -> None:
        cwd.mkdir(parents=True)
        self.log = cwd / "worker.log"
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self) -> str:
        return f"--- {self.log}\n{self.text()[-2500:]}"

    def started(self) -> list[int]:
        """The trials this worker started (its log's `tN ... started` lines)."""
        return [
            int(line.split("] t", 1)[1].split()[0])
            for line in self.text().splitlines()
            if line.startswith("[sweep ") and line.endswith(" started") and "] t" in line
        ]


def test_a_sweep_over_hosts_apart_survives_a_cut_link_and_a_skewed_clock(tmp_path):
    reason = unavailable() or faketime_missing()
    if reason:
        pytest.skip(reason)
    with hosts_apart(HOSTS) as hosts:
        listen = ("127.0.0.1", *hosts.servers())
        with started_server(listen, hosts.subnet(), tuple(SERVER_KEEPALIVES)) as server:
            sweep_over_hosts(server, hosts, tmp_path)
    assert hosts.left_behind() == []


def sweep_over_hosts(server, hosts, root: Path) -> None:
    for name in ("optuna", "mlflow", "ref_optuna", "ref_mlflow"):
        server.database(name)
    args = one_seed_unless_named([*GRID, *TRAINING, *SWEEP])
    sweep = [sys.executable, "-m", "sweeper", "-m"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    workers = []
    for i in range(HOSTS):
        storage, tracking = (
            host_url(server.base_url, hosts.server(i), d) for d in ("optuna", "mlflow")
        )
        host_env = {
            **env,
            "MLFLOW_TRACKING_URI": tracking,
            **(skewed(SKEW_S) if i == SKEWED else {}),
        }
        command = [*hosts.prefix(i), *sweep, f"hydra.sweeper.storage='{storage}'", *args]
        workers.append(Worker(command, root / f"host{i}", host_env))
    reference = Worker(
        [*sweep, f"hydra.sweeper.storage={server.database('ref_optuna')}", *args],
        root / "reference",
        {**env, "MLFLOW_TRACKING_URI": server.database("ref_mlflow")},
    )
    everyone = [*workers, reference]
    try:
        check_the_sweep(server, hosts, workers, reference)
    finally:
        for w in everyone:
            w.process.kill()
            w.process.wait()


def check_the_sweep(server, hosts, workers: list[Worker], reference: Worker) -> None:
    storage, tracking = server.database("optuna"), server.database("mlflow")
    everyone = [*workers, reference]

    # The cut: once host CUT's trial has saved its first checkpoint (step 3; step 4 is
    # logged after it), its link drops every packet.
    cut_off = workers[CUT]
    until(lambda: cut_off.started(), "host 1 never started a trial", everyone)
    (lost,) = cut_off.started()
    until(lambda: steps_logged(tracking, lost) >= 4, "host 1 never got to step 4", everyone)
    hosts.cut(CUT)
    try:
        # Healed once another host runs the point again (its trial was taken over).
        until(lambda: retried(storage, lost), f"t{lost} was never taken over", everyone)
    finally:
        hosts.heal(CUT)
    until(lambda: all(w.process.poll() is not None for w in everyone), "sweeps ended", everyone)
    for w in everyone:
        assert w.process.returncode == 0, w.tail()
    assert f"t{lost} was taken over by another worker" in cut_off.text(), cut_off.tail()

    trials = trials_of(storage)
    assert ended_once(trials, tracking, POINTS) == []
    assert metric_steps_logged_twice(tracking) == []
    taken_over = [t.number for t in trials if TrialAttr.RETRY_OF in t.user_attrs]
    assert [t.user_attrs[TrialAttr.RETRY_OF] for t in trials if t.number in taken_over] == [lost]

    # The skewed host ran a trial, stamped on its own clock five minutes ahead (Optuna's
    # datetime_complete is the client's, its last heartbeat the database's), yet took over
    # nothing and lost nothing.
    on_skewed = workers[SKEWED].started()
    assert on_skewed and lost not in on_skewed
    ahead = clock_ahead(storage, trials)
    # (A trial's end comes after its last beat, by as long as its tell takes under load.)
    assert all(ahead[n] > SKEW_S - 30 for n in on_skewed), ahead
    assert all(-5 < s < 60 for n, s in ahead.items() if n not in on_skewed), ahead

    # Point by point, the same as the sweep that met no fault: resume is bit-identical.
    same = compared(
        records(trials_of(server.database("ref_optuna")), server.database("ref_mlflow")),
        records(trials, tracking),
    )
    assert same["differences"] == [], same
    assert same["resumed_points"] == 1, same  # the cut-off point, from its checkpoint


def retried(storage: str, lost: int) -> bool:
    """Another worker runs (or ran) the lost trial's point again."""
    return any(t.user_attrs.get(TrialAttr.RETRY_OF) == lost for t in trials_of(storage))


def steps_logged(tracking: str, trial_number: int) -> int:
    """The last step the trial's training run logged (-1 before the first)."""
    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name("grpo")
    if experiment is None:
        return -1
    runs = client.search_runs(
        [experiment.experiment_id], f"tags.`{Tag.TRIAL_NUMBER}` = '{trial_number}'"
    )
    history = [m.step for r in runs for m in client.get_metric_history(r.info.run_id, REWARD)]
    time.sleep(0.4)  # polled: not oftener than this
    return max(history, default=-1)
