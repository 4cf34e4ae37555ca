"""What a cluster does to a sweep: SIGTERM (preemption, a time limit, `docker stop`) and a lost
host (kill -9). Either way nothing is left RUNNING once it is handled, the same command
completes the grid with every point once, and an interrupted point resumes from its last
checkpoint, continuing the same MLflow run."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import run_sweep, start_sweep, study_in, study_uri
from mlflow.tracking import MlflowClient

from records.metrics import REWARD
from records.optuna_storage import exclusive
from records.sweep import State, StudyAttr, TrialAttr, replicate_key, replicates
from sweeper.study import recovery
from sweeper.sweep import tell

pytestmark = pytest.mark.slow

ARGS = ["group_size=2,4", "batch_size=4", "max_steps=30", "eval_every=0", "task.eval_size=16"]
ARGS += ["save_every=3", "hydra.sweeper.heartbeat_interval=1", "hydra.sweeper.grace_period=3"]
ARGS += ["hydra.sweeper.health=[]"]  # about preemption: no trial may stop early on its own


def _start(cwd: Path) -> subprocess.Popen:
    return start_sweep(cwd, *ARGS, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait_for_checkpoint(cwd: Path, timeout: float = 180) -> None:
    """Until a trial has saved its second checkpoint: a signal now lands mid-training."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if list(cwd.glob("multirun/*/*/t*/checkpoints/step_000006/state.json")):
            return
        time.sleep(0.2)
    raise TimeoutError("no trial reached its second checkpoint")


def _runs(cwd: Path) -> list:
    client = MlflowClient(f"sqlite:///{cwd}/mlflow.db")
    return client.search_runs([client.get_experiment_by_name("grpo").experiment_id])


def _resumes_and_completes(cwd: Path) -> None:
    done = run_sweep(cwd, *ARGS)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = study_in(cwd).trials
    completed = [t for t in trials if t.state.name == "COMPLETE"]
    assert sorted(t.params["group_size"] for t in completed) == [2, 4]  # every point once
    (retry,) = [t for t in completed if TrialAttr.RETRY_OF in t.user_attrs]
    (seed_run,) = replicates(retry)
    assert seed_run.resumed_from_step is not None and seed_run.resumed_from_step >= 6
    assert seed_run.state == State.COMPLETE and seed_run.steps_run == 30
    # the interrupted run continued: one MLflow run holds the whole curve, steps 1..30
    interrupted = next(t for t in trials if t.number == retry.user_attrs[TrialAttr.RETRY_OF])
    assert interrupted.user_attrs[TrialAttr.MLFLOW_RUN_ID] == seed_run.run_id
    client = MlflowClient(f"sqlite:///{cwd}/mlflow.db")
    steps = {m.step for m in client.get_metric_history(seed_run.run_id, "reward/mean")}
    assert steps == set(range(1, 31))
    assert all(r.info.status != "RUNNING" for r in _runs(cwd))


def test_sigterm_closes_everything_at_once_and_the_point_resumes(tmp_path):
    sweep = _start(tmp_path)
    _wait_for_checkpoint(tmp_path)
    signalled = time.monotonic()
    sweep.send_signal(signal.SIGTERM)
    _, stderr = sweep.communicate(timeout=30)
    assert time.monotonic() - signalled < 10
    assert sweep.returncode != 0
    assert "interrupted (SIGTERM)" in stderr and "resume with the same command" in stderr
    # at once, with no grace period to wait for: nothing RUNNING in either store
    assert [t.number for t in study_in(tmp_path).trials if t.state.name == "RUNNING"] == []
    assert [r.info.run_name for r in _runs(tmp_path) if r.info.status == "RUNNING"] == []
    _resumes_and_completes(tmp_path)


def test_a_worker_killed_while_giving_a_lost_trial_back_loses_neither_point_nor_checkpoint(
    tmp_path, monkeypatch
):
    """kill -9 mid-training, then the same command resumes the point from its checkpoint.
    Here the next worker's recovery is also killed halfway (found by bench/bench_chaos.py:
    a worker killed after failing a stale trial but before closing its run and queuing its
    point left that run RUNNING for good, and a later worker queued the point afresh, from
    step 0). The worker after it gives the point back itself: from its checkpoint, in the
    same MLflow run, closed at the end. (A whole recovery after kill -9, by the sweep's own
    stale-trial check: test_sweeper_cli.py's Ctrl-C and kill -9 test.)"""
    sweep = _start(tmp_path)
    _wait_for_checkpoint(tmp_path)
    sweep.kill()
    sweep.wait(timeout=30)
    time.sleep(4)  # past the heartbeat grace period
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    import optuna

    from records.optuna_storage import open_storage

    url = study_uri(tmp_path)
    (name,) = optuna.get_all_study_names(url)
    study = optuna.load_study(study_name=name, storage=open_storage(url, 1, 3))  # as the sweep's
    with exclusive(url):  # a worker's recovery, killed after its first half
        (lost,) = recovery.fail_stale_trials(study, tell.STALE_REASON, max_in_a_row=3)
    assert [r.info.run_name for r in _runs(tmp_path) if r.info.status == "RUNNING"] != []
    _resumes_and_completes(tmp_path)
    assert [t.user_attrs.get(TrialAttr.RETRY_OF) for t in study_in(tmp_path).trials].count(
        lost.number
    ) == 1


def test_a_run_reopened_by_a_worker_that_lost_its_trial_is_closed_as_its_seed_ended(
    tmp_path, monkeypatch
):
    """A worker whose trial is taken over just as it reopens the run it resumes (found by the
    chaos benchmark) leaves that run RUNNING after the point completed in it. The sweep's end
    closes it as the seed that last recorded it ended; a run of a trial still running is
    left alone."""
    import optuna

    from records.sweep import Replicate, Role, Tag
    from records.tracking import MLflowRun

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/study.db", study_name="s")

    def trial_with_run() -> tuple[optuna.Trial, MLflowRun]:
        trial = study.ask()
        tags = {Tag.ROLE: Role.TRIAL, Tag.STUDY: "s", Tag.TRIAL_NUMBER: str(trial.number)}
        run = MLflowRun("grpo", f"t{trial.number}", tags=tags)
        record = Replicate(0, State.COMPLETE, 0.5, None, 9, None, "", run.run_id)
        trial.set_user_attr(replicate_key(0), record.as_attr())
        return trial, run

    done, reopened = trial_with_run()
    reopened.end("FINISHED")
    study.tell(done, 0.5)
    reopened.reopen()  # the zombie's attach, after the point completed
    _, live = trial_with_run()
    tell.close_runs_left_running(study)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    assert client.get_run(reopened.run_id).info.status == "FINISHED"
    assert client.get_run(live.run_id).info.status == "RUNNING"  # its trial still runs
    orphan = MLflowRun(
        "grpo", "t9", tags={Tag.ROLE: Role.TRIAL, Tag.STUDY: "s", Tag.TRIAL_NUMBER: "9"}
    )
    tell.close_runs_left_running(study)  # no trial 9 recorded it: it failed
    assert client.get_run(orphan.run_id).info.status == "FAILED"
    assert client.get_run(orphan.run_id).data.tags[Tag.FAIL_REASON] == tell.LEFT_RUNNING


def test_a_worker_whose_trial_was_taken_over_drops_its_result_and_ends_cleanly(
    tmp_path, monkeypatch
):
    """A worker whose heartbeats another worker missed (a stalled host, a locked database) has
    its trial lost and its point queued again, as the other worker's recovery does it. When its
    own run then ends it drops that result and goes on (it once crashed writing to the finished
    trial): it takes the queued point, and the point completes once."""
    args = ["lr=1e-3", "batch_size=4", "max_steps=40", "eval_every=0", "save_every=0"]
    args += ["task.eval_size=16", "hydra.sweeper.health=[]"]
    worker = start_sweep(tmp_path, *args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while not (run_id := _training_run(tmp_path)):  # training, its first steps logged
        assert worker.poll() is None and time.monotonic() < deadline, worker.stdout.read()[-3000:]
        time.sleep(0.2)
    study = study_in(tmp_path)
    trial_id = _running(tmp_path)[0]._trial_id
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    with exclusive(study_uri(tmp_path)):  # as a worker's recovery does: lose and re-queue at once
        assert recovery.lose(study, trial_id, "its sweeper stopped (this test)", max_in_a_row=3)
        tell.give_back(study, study._storage.get_trial(trial_id), "test")  # closes its runs
    out = worker.communicate(timeout=600)[0]
    assert worker.returncode == 0, out[-3000:]
    assert "t0 was taken over by another worker" in out, out[-3000:]
    trials = study_in(tmp_path).trials
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"], out[-3000:]
    assert trials[0].user_attrs[TrialAttr.FAIL_REASON].startswith("lost: its sweeper stopped")
    # It went quiet at once: the retry continues the point's one MLflow run (one record per
    # point) and every step is in it exactly once, so the lost attempt wrote none twice.
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    steps = [m.step for m in client.get_metric_history(run_id, REWARD)]
    assert sorted(steps) == list(range(1, 41))
    assert client.get_run(run_id).info.status == "FINISHED"


def _training_run(cwd: Path) -> str | None:
    """The running trial's MLflow run once it has logged a step (None before)."""
    running = _running(cwd)
    run_id = running[0].user_attrs.get(TrialAttr.MLFLOW_RUN_ID) if running else None
    if not run_id:  # not before the worker made the store: two creators race (the sweep copes)
        return None
    client = MlflowClient(f"sqlite:///{cwd}/mlflow.db")
    return run_id if client.get_metric_history(run_id, REWARD) else None


def _running(cwd: Path) -> list:
    """The RUNNING trials of the sweep in cwd (none while the study does not exist yet)."""
    try:
        return [t for t in study_in(cwd).trials if t.state.name == "RUNNING"]
    except ValueError:  # no study yet
        return []


def test_an_interrupted_trial_closes_the_runs_it_had_not_recorded_yet(tmp_path, monkeypatch):
    """Found by bench/bench_chaos.py: SIGTERM between a job reopening the run it resumes (or
    creating a new one) and recording its id in the trial left that run RUNNING for good, and
    the retry started a second run. The trial's runs are found by their tags and closed, and
    the run to resume passes to the retry."""
    import optuna

    from records.sweep import Role, Tag
    from records.tracking import MLflowRun
    from sweeper import optuna_adapter as oa

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/study.db", study_name="s")

    def trial_run(number: int) -> MLflowRun:
        tags = {Tag.ROLE: Role.TRIAL, Tag.STUDY: "s", Tag.TRIAL_NUMBER: str(number)}
        return MLflowRun("grpo", f"t{number}", tags=tags)

    earlier = trial_run(7)  # an earlier attempt's run, which this trial resumes
    earlier.end("KILLED")
    resume = {"0": {"output_dir": str(tmp_path / "t7"), "run_id": earlier.run_id}}
    study.enqueue_trial({"x": 1}, user_attrs={TrialAttr.RESUME_DIRS: resume})
    trial = study.ask()
    earlier.reopen()  # the job attached to it...
    created = trial_run(trial.number)  # ...or created one, then SIGTERM before recording either
    assert recovery.interrupt(study, trial._trial_id, "interrupted (SIGTERM); queued again")
    tell.give_back(study, oa.fresh(study, trial._trial_id), "s", killed=True)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    assert [client.get_run(r.run_id).info.status for r in (earlier, created)] == ["KILLED"] * 2
    (retry,) = oa.waiting_trials(study)
    assert retry.user_attrs[TrialAttr.RESUME_DIRS] == resume  # the retry continues that run


# --- the health monitor survives the resume -------------------------------------------------

# One collapsing point (tiny model, lr=3e-2: eval 0.28 -> 0.0 within 10 steps, bench/HEALTH.md)
# watched by eval_collapse alone: it reads the step-0 baseline, which a resume never sees
# again, so only a monitor that came back with the checkpoint can prune it after a resume.
COLLAPSE = ["lr=3e-2", "batch_size=4", "group_size=4", "max_steps=20", "eval_every=10"]
COLLAPSE += ["task.eval_size=16", "save_every=2"]
COLLAPSE += ["hydra.sweeper.heartbeat_interval=1", "hydra.sweeper.grace_period=3"]
COLLAPSE += [
    "hydra.sweeper.health=[{name: eval_collapse, metric: eval/reward/mean, "
    "check: below_baseline, bound: 0.1}]"
]
FIRST_CHECKPOINT = {"ours": "checkpoints/step_000002/state.json", "trl": "checkpoint-2/health.json"}


@pytest.mark.parametrize("backend", ["ours", "trl"])
def test_a_trial_resumed_mid_collapse_is_pruned_at_the_uninterrupted_step(tmp_path, backend):
    """SIGTERM once the trial's step-2 checkpoint is saved (its collapse shows at the step-10
    eval), then the same command: the resumed trial is pruned by eval_collapse at the step the
    rules prune its whole recorded curve at (an uninterrupted monitor on the same metrics)."""
    from trainer.run.health import replay, rules_from_settings

    args = [*COLLAPSE, *(["backend=trl"] if backend == "trl" else [])]
    sweep = start_sweep(tmp_path, *args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not list(tmp_path.glob(f"multirun/*/*/t*/{FIRST_CHECKPOINT[backend]}")):
        assert sweep.poll() is None, sweep.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the trial saved no step-2 checkpoint"
        time.sleep(0.2)
    sweep.send_signal(signal.SIGTERM)
    _, stderr = sweep.communicate(timeout=60)
    assert "resume with the same command" in stderr, stderr[-3000:]
    done = run_sweep(tmp_path, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    study = study_in(tmp_path)
    (retry,) = [t for t in study.trials if TrialAttr.RETRY_OF in t.user_attrs]
    (seed_run,) = replicates(retry)
    assert retry.state.name == "PRUNED", seed_run.reason
    assert seed_run.breach["rule"] == "eval_collapse"
    assert 2 <= seed_run.resumed_from_step < seed_run.breach["step"]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    history = client.get_metric_history(seed_run.run_id, "eval/reward/mean")
    curve = {m.step: {"eval/reward/mean": m.value} for m in history}
    assert 0 in curve  # the baseline, from before the preemption
    rules = rules_from_settings(study.user_attrs[StudyAttr.HEALTH_RULES], 0.01)
    assert replay(rules, curve).step == seed_run.breach["step"]
