"""Real sweeps through the CLI: `python -m sweeper -m ...` in a temporary directory, with a
real SQLite Optuna storage and MLflow store, checked through optuna.load_study and
MlflowClient. Each run is a few steps on tiny batches of the embedded model."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from conftest import mlflow_uri, run_sweep, start_sweep, study_in, study_uri, sweep_env
from mlflow.tracking import MlflowClient

from analysis.text import trial_note
from records.sweep import best_trial

pytestmark = pytest.mark.slow

SMALL = ["batch_size=4", "max_steps=3", "eval_every=2", "task.eval_size=16"]
# lr=0.5 with two minibatches a step: the second minibatch is far off-policy, so the
# sampler-vs-learner KL jumps past 0.01 at the first step with a learning signal (step 1 or
# 2); lr=1e-3 stays ~1e-4, far under it.
GRID = ["lr=1e-3,0.5", "group_size=2,4", "num_substeps=2", *SMALL]


def mlflow_runs(cwd: Path) -> dict[str, object]:
    client = MlflowClient(mlflow_uri(cwd))
    experiment = client.get_experiment_by_name("grpo")
    return {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}


def outcome(study: optuna.Study) -> dict[tuple, str]:
    return {tuple(sorted(t.params.items())): t.state.name for t in study.trials}


# The terminal of each grid_dir sweep (stderr, then stdout), by directory.
GRID_STDERR: dict[Path, str] = {}
GRID_TERMINAL: dict[Path, str] = {}


@pytest.fixture(scope="session")
def grid_dir(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("grid")
    started = time.perf_counter()
    result = run_sweep(cwd, *GRID)
    assert result.returncode == 0, result.stderr[-3000:]
    print(f"grid sweep of 4 trials: {time.perf_counter() - started:.1f} s")
    GRID_STDERR[cwd] = result.stderr
    GRID_TERMINAL[cwd] = result.stderr + result.stdout
    return cwd


def test_the_terminal_is_quiet_and_says_nothing_twice(grid_dir):
    """Hydra's launch line (internal trial.* overrides), transformers' loading bar, MLflow's
    and Optuna's INFO lines stay off the terminal, and the trainer's INFO lines and progress
    bar go to each trial's log file; the end repeats no line. From start to verdict the 4
    trials fit one screen, each trial's end line saying why it was pruned; a pipe gets no
    carriage-return bar."""
    terminal = GRID_TERMINAL[grid_dir]
    for chatter in ("Launching 1 jobs", "trial.id=", "Loading weights", "INFO mlflow", "[I "):
        assert chatter not in terminal, chatter
    assert "\r" not in terminal and "Training 3 steps" not in terminal and "grpo:" not in terminal
    assert len(terminal.splitlines()) <= 40, terminal
    study = study_in(grid_dir)
    for t in study.trials:
        log = next(grid_dir.glob(f"multirun/*/*/t{t.number}/__main__.log")).read_text()
        assert "Training 3 steps" in log and "grpo:" in log, log[-2000:]
        (ended,) = [line for line in terminal.splitlines() if f" t{t.number} lr=" in line
                    and "started" not in line]  # fmt: skip
        assert trial_note(t) in ended if t.state.name == "PRUNED" else f"{t.value:.4g}" in ended
    lines = GRID_STDERR[grid_dir].splitlines()
    assert sum("4/4 done" in line for line in lines) == 1, GRID_STDERR[grid_dir][-3000:]
    assert len(lines) == len(set(lines)), GRID_STDERR[grid_dir][-3000:]


def test_grid_runs_every_point_once_and_prunes_the_unstable_lr(grid_dir):
    study = study_in(grid_dir)
    assert outcome(study) == {
        (("group_size", 2), ("lr", 0.001)): "COMPLETE",
        (("group_size", 4), ("lr", 0.001)): "COMPLETE",
        (("group_size", 2), ("lr", 0.5)): "PRUNED",
        (("group_size", 4), ("lr", 0.5)): "PRUNED",
    }
    for t in study.trials:
        assert t.user_attrs["overrides"][-2:] == [
            f"lr={t.params['lr']}",
            f"group_size={t.params['group_size']}",
        ]
        assert t.user_attrs["baseline_reward"] == t.intermediate_values[0]
        if t.state == optuna.trial.TrialState.PRUNED:
            breach = t.user_attrs["prune_reason"]  # the health rule that fired, and where
            assert breach["rule"] in ("sampler_kl", "post_update_kl", "eval_collapse")
            assert breach["step"] == t.user_attrs["steps_run"] <= 3
        else:
            assert t.user_attrs["steps_run"] == 3
            assert sorted(t.intermediate_values) == [0, 2, 3]  # baseline and eval steps
            assert t.value == t.intermediate_values[3]
    attrs = study.user_attrs
    assert attrs["search_space"] == {"lr": "1e-3,0.5", "group_size": "2,4"}
    assert attrs["sampler"] == "grid" and attrs["objective"] == "eval/reward/mean"
    assert study.metric_names == ["eval/reward/mean"]  # optuna-dashboard's name for the value


def test_mlflow_has_a_parent_run_and_one_child_per_trial(grid_dir):
    study = study_in(grid_dir)
    runs = mlflow_runs(grid_dir)
    parent = runs.pop(study.study_name)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["sweeper.role"] == "study"
    assert parent.data.params["search_space.lr"] == "1e-3,0.5"
    assert parent.data.metrics["best_value"] == best_trial(study.trials, maximize=True).value
    assert len(runs) == 4
    client = MlflowClient(mlflow_uri(grid_dir))
    for t in study.trials:
        name = f"t{t.number} lr={t.params['lr']} group_size={t.params['group_size']}"
        run = runs[name]
        tags = run.data.tags
        assert run.info.run_id == t.user_attrs["mlflow_run_id"]
        assert tags["mlflow.parentRunId"] == parent.info.run_id
        assert tags["sweeper.trial_number"] == str(t.number)
        assert tags["sweeper.state"] == t.state.name
        assert run.data.params["lr"] == str(t.params["lr"])
        assert run.data.params["loss.name"] == "importance_sampling"  # every resolved key
        assert run.data.params["onednn"] == "off"  # the trainer's choice, as its policy loaded
        assert 1 <= int(run.data.params["threads"]) <= os.cpu_count()  # the run's own choice
        assert "trial.id" not in run.data.params
        history = client.get_metric_history(run.info.run_id, "reward/mean")
        assert [m.step for m in history] == list(range(1, t.user_attrs["steps_run"] + 1))
        if t.state.name == "PRUNED":
            assert run.info.status == "KILLED"
            # the same one line as the table's note, which adds the warnings before it
            assert tags["sweeper.prune_reason"] == trial_note(t).split("; warning ")[0]
        else:
            assert run.info.status == "FINISHED"
            evals = client.get_metric_history(run.info.run_id, "eval/reward/mean")
            assert [m.step for m in evals] == [0, 2, 3]
        artifacts = [a.path for a in client.list_artifacts(run.info.run_id)]
        assert "config.yaml" in artifacts


def test_rerunning_a_finished_grid_adds_no_trial(grid_dir):
    before = len(study_in(grid_dir).trials)
    result = run_sweep(grid_dir, *GRID)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(study_in(grid_dir).trials) == before
    assert "4/4 done (2 pruned, 0 failed)" in result.stderr


def test_tuned_config_is_the_best_trial_and_trains(grid_dir):
    study = study_in(grid_dir)
    best = best_trial(study.trials, maximize=True)
    text = (grid_dir / "tuned" / f"{study.study_name}.yaml").read_text()
    assert text.startswith("# @package _global_")
    assert f"trial: t{best.number}" in text and best.user_attrs["mlflow_run_id"] in text
    result = subprocess.run(
        [sys.executable, "-m", "trainer", f"+tuned={study.study_name}", "max_steps=1"],
        cwd=grid_dir,
        env=sweep_env(grid_dir),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rollouts = 4 * best.params["group_size"]  # batch_size=4 came from the tuned file
    assert f"lr=0.001, {rollouts} rollouts a step" in result.stdout + result.stderr


def test_joblib_launcher_gives_the_same_result(grid_dir, tmp_path):
    result = run_sweep(
        tmp_path,
        *GRID,
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "hydra.sweeper.n_jobs=2",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    basic, joblib = study_in(grid_dir), study_in(tmp_path)
    assert basic.study_name == joblib.study_name  # the launcher is not part of the study
    assert outcome(joblib) == outcome(basic)
    values = {
        tuple(sorted(t.params.items())): t.value for t in basic.trials if t.state.name == "COMPLETE"
    }
    # A trial's result depends on its seed and settings, not on the process that ran it.
    for t in joblib.trials:
        if t.state.name == "COMPLETE":
            assert t.value == values[tuple(sorted(t.params.items()))]
    assert len(mlflow_runs(tmp_path)) == 5


def test_a_failing_trial_does_not_stop_the_sweep(tmp_path):
    # cuda:99 passes validation but cannot load the model, on CPU and GPU machines alike.
    result = run_sweep(tmp_path, "model.device=cpu,cuda:99", "group_size=2", *SMALL)
    assert result.returncode == 0, result.stderr[-3000:]
    study = study_in(tmp_path)
    by_device = {t.params["model.device"]: t for t in study.trials}
    assert by_device["cpu"].state.name == "COMPLETE"
    failed = by_device["cuda:99"]
    assert failed.state.name == "FAIL" and "\n" not in failed.user_attrs["fail_reason"]
    ended = f"t{failed.number} model.device=cuda:99: failed at step 0"  # its one end line
    assert f"{ended} in " in result.stderr and failed.user_attrs["fail_reason"] in result.stderr
    assert result.stderr.count(failed.user_attrs["fail_reason"]) == 1, result.stderr[-3000:]
    run = mlflow_runs(tmp_path)[f"t{failed.number} model.device=cuda:99"]
    assert run.info.status == "FAILED"
    assert run.data.tags["sweeper.fail_reason"] == failed.user_attrs["fail_reason"]

    stopped = run_sweep(
        tmp_path, "model.device=cuda:98,cuda:99", "hydra.sweeper.max_failure_rate=0", *SMALL
    )
    assert stopped.returncode == 1
    assert "max_failure_rate=0" in stopped.stderr.strip().splitlines()[-1]
    names = optuna.get_all_study_names(study_uri(tmp_path))
    (second,) = [n for n in names if n != study.study_name]
    trials = optuna.load_study(study_name=second, storage=study_uri(tmp_path)).trials
    assert [t.state.name for t in trials] == ["FAIL", "WAITING"]  # stopped after the first


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["temperature=0.7,0"], "error: temperature=0.0: must be in (0, 10)"),
        (["lr_typo=1e-3,1e-2"], "error: lr_typo=1e-3,1e-2: no such setting (closest: lr)"),
    ],
)
def test_bad_points_fail_before_anything_is_created(tmp_path, args, expected):
    result = run_sweep(tmp_path, *args, timeout=120, store=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(expected)
    assert not (tmp_path / "sweeps.db").exists() and not (tmp_path / "mlflow.db").exists()


def _wait_for_training(cwd: Path, count: int, timeout: float = 120) -> None:
    """Until `count` trials have started and one is RUNNING past its baseline eval (the
    step-0 report), so a signal now lands in the middle of its training."""
    deadline = time.monotonic() + timeout
    query = (
        "select t.state, count(v.step) from trials t left join trial_intermediate_values v "
        "on v.trial_id = t.trial_id group by t.trial_id"
    )
    while time.monotonic() < deadline:
        try:
            with sqlite3.connect(cwd / "sweeps.db") as con:
                rows = list(con.execute(query))
            if len(rows) >= count and ("RUNNING", 1) in rows:
                return
        except sqlite3.Error:
            pass
        time.sleep(0.2)
    raise TimeoutError("no trial started training")


def test_ctrl_c_and_kill_9_then_the_same_command_resumes(tmp_path):
    args = ["group_size=2,4", "batch_size=4", "max_steps=40", "eval_every=0", "task.eval_size=16"]
    args += ["hydra.sweeper.heartbeat_interval=1", "hydra.sweeper.grace_period=3"]
    args += ["hydra.sweeper.health=[]"]  # about interruption: no trial stops early on its own

    def start() -> subprocess.Popen:
        return start_sweep(
            tmp_path,
            *args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
        )

    first = start()
    _wait_for_training(tmp_path, 1)
    first.send_signal(signal.SIGINT)
    _, stderr = first.communicate(timeout=60)
    assert first.returncode != 0
    assert "resume with the same command" in stderr.strip().splitlines()[-1]

    second = start()
    _wait_for_training(tmp_path, 2)
    second.kill()
    second.wait(timeout=60)

    third = run_sweep(tmp_path, *args)
    assert third.returncode == 0, third.stderr[-3000:]
    study = study_in(tmp_path)
    runs = {r.info.run_id: r for r in mlflow_runs(tmp_path).values()}
    interrupted, completed = study.trials[:2], study.trials[2:]
    assert [t.state.name for t in interrupted] == ["FAIL", "FAIL"]
    assert interrupted[0].user_attrs["fail_reason"].startswith("interrupted (Ctrl-C)")
    assert interrupted[1].user_attrs["fail_reason"].startswith("lost: its sweeper stopped")
    # every grid point completed exactly once; the interrupted points ran again
    assert sorted(t.params["group_size"] for t in completed) == [2, 4]
    assert all(t.state.name == "COMPLETE" for t in completed)
    # Interrupted before any checkpoint, a point goes on in the same MLflow run: one run per
    # point, FINISHED, each step of its curve once.
    point_run = {t.params["group_size"]: t.user_attrs["mlflow_run_id"] for t in completed}
    assert [t.user_attrs["mlflow_run_id"] in point_run.values() for t in interrupted] == [True] * 2
    assert sorted(
        r.info.run_id for r in runs.values() if "sweeper.trial_number" in r.data.tags
    ) == sorted(point_run.values())
    client = MlflowClient(mlflow_uri(tmp_path))
    for run_id in point_run.values():
        assert runs[run_id].info.status == "FINISHED"
        steps = [m.step for m in client.get_metric_history(run_id, "reward/mean")]
        assert steps == list(range(1, 41))
