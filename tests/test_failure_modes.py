"""GRPO's failure-mode rules (warnings) in real sweeps on the tiny model: a run that breaks
each way is flagged with a warning (MLflow tag and metric) and runs on, and a healthy default
run is flagged with nothing. Where no cheap real run breaks a way, a hand-written metric stream
on the HealthMonitor stands in (said in the test)."""

from __future__ import annotations

import os
from pathlib import Path

import optuna
import pytest
from conftest import mlflow_uri, run_sweep, study_in, study_uri, sweep_env
from mlflow.tracking import MlflowClient

from analysis.load import load_study
from analysis.report import leaderboard_rows
from records import metrics
from records.sweep import WARNING_METRIC_PREFIX, Tag, TrialAttr
from trainer.run.health import HealthMonitor, failure_mode_rules

TESTS = Path(__file__).resolve().parent
# Short and small: the rules with patience 5 need 5 steps after step 0. The eval is 64
# problems: on 16, one healthy run's baseline drew 7 of 16 and its step-3 eval 4 of 16 (the
# tiny model as built on an Intel Xeon host), a drop eval_collapse prunes; on 64 the same run
# reads 0.23, 0.27, 0.28.
SHORT = ["max_steps=6", "batch_size=8", "group_size=4", "eval_every=3", "task.eval_size=64"]


def sweep_with_user_rewards(cwd, *args: str):
    """A sweep that can import tests/user_rewards.py."""
    env = sweep_env(cwd)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    return run_sweep(cwd, *args, timeout=900, env=env)


def warnings_of(cwd, trial: optuna.trial.FrozenTrial) -> dict[str, str]:
    """The trial's warnings as its MLflow run records them: {rule: line}, each rule's tag
    checked to have its metric beside it."""
    client = MlflowClient(mlflow_uri(cwd))
    run = client.get_run(trial.user_attrs[TrialAttr.MLFLOW_RUN_ID])
    found = {
        key.removeprefix(Tag.WARNING_PREFIX): line
        for key, line in run.data.tags.items()
        if key.startswith(Tag.WARNING_PREFIX)
    }
    flagged = {
        key.removeprefix(WARNING_METRIC_PREFIX)
        for key in run.data.metrics
        if key.startswith(WARNING_METRIC_PREFIX)
    }
    assert flagged == set(found)
    return found


def completed(cwd) -> dict:
    """Each trial by its params; every one ran to the end (a warning never prunes)."""
    trials = study_in(cwd).trials
    for t in trials:
        assert t.state == optuna.trial.TrialState.COMPLETE, t.user_attrs.get("prune_reason")
        assert t.user_attrs[TrialAttr.STEPS_RUN] == 6
    return {tuple(t.params.values()): t for t in trials}


@pytest.mark.slow
def test_truncation_is_flagged_and_a_healthy_default_run_is_not(tmp_path):
    """max_tokens=1 cuts every completion (and every group then scores 0 alike); the default
    max_tokens=8 is the healthy default run: no warning at all, not only no pruning rule."""
    done = run_sweep(tmp_path, "max_tokens=1,8", *SHORT, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = completed(tmp_path)
    cut = warnings_of(tmp_path, trials[(1,)])
    assert cut["truncation"].startswith("truncation: completions/truncated=1 > 0.9 at step 5")
    assert "no_learning_signal" in cut
    assert warnings_of(tmp_path, trials[(8,)]) == {}
    # Listed in the final table's note and in the report's leaderboard.
    assert f"warning {cut['truncation']}" in done.stdout
    data = load_study(study_uri(tmp_path))
    notes = {t.number: t.note for t in data.trials}
    assert f"warning {cut['truncation']}" in notes[trials[(1,)].number]
    assert notes[trials[(8,)].number] == ""
    rows = leaderboard_rows(data)[1]
    assert any(f"warning {cut['truncation']}" in cell for row in rows for cell in row)


@pytest.mark.slow
def test_a_reward_that_scores_every_completion_alike_is_flagged(tmp_path):
    """A user reward that always returns 1: every group has zero advantage."""
    done = sweep_with_user_rewards(
        tmp_path, "task.rewards=[{_target_:user_rewards.always_one}]", *SHORT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (trial,) = completed(tmp_path).values()
    found = warnings_of(tmp_path, trial)
    assert set(found) == {"no_learning_signal"}
    assert (
        "groups/frac_zero_advantage=1 > 0.9 at step 5 (most groups score alike"
        in found["no_learning_signal"]
    )


@pytest.mark.slow
def test_a_reward_paying_for_length_is_flagged_as_a_length_blowup(tmp_path):
    """A user reward paying for length; temperature 1.5 spreads the first (2-3 digit)
    completions' lengths so groups differ, and lr=1e-2 learns to stop ending within 16 steps
    (the mean length passed 3 x its first value at step 11 on an Intel Xeon host, by step 10
    on the AMD hosts before; the bound is now 1.5 x).
    That lr moves the policy past the post-update KL rule first, so the KL bound is raised
    (kl_threshold=10) to let the run live long enough to blow up."""
    done = sweep_with_user_rewards(
        tmp_path, "task.rewards=[{_target_:user_rewards.longer_is_better}]", "temperature=1.5",
        "lr=1e-2", "max_tokens=32", "hydra.sweeper.kl_threshold=10", "max_steps=16",
        "batch_size=8", "group_size=4", "eval_every=0", "task.eval_size=16",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (trial,) = study_in(tmp_path).trials
    assert trial.state == optuna.trial.TrialState.COMPLETE
    found = warnings_of(tmp_path, trial)
    assert "completions/mean_length=" in found["length_blowup"]
    assert "> 1.5 x its first value" in found["length_blowup"]


def monitor_warnings(stream: dict[int, dict[str, float]]) -> dict[str, int]:
    """{rule: step it first warned} from a hand-written stream; asserts none prunes."""
    monitor, first = HealthMonitor(failure_mode_rules()), {}
    for step, values in stream.items():
        for breach in monitor.breaches(step, values):
            assert breach.action == "warn"
            first.setdefault(breach.rule, breach.step)
    return first


def test_entropy_collapse_on_a_hand_written_stream():
    """No cheap real run drives the tiny model's entropy down: lr up to 1, full fine-tuning
    at lr=3e-2 and short-answer rewards all keep it at 0.5-2 nats over 8 steps (it rises as
    the policy breaks). So a hand-written stream: 0.6 nats falling to 0.05 (< 0.1 x 0.6)."""
    entropy = [0.6, 0.4, 0.05, 0.04, 0.03, 0.03]
    stream = {s: {metrics.ENTROPY: v} for s, v in enumerate(entropy, start=1)}
    assert monitor_warnings(stream) == {"entropy_collapse": 5}  # 3 steps in a row from step 3


def test_train_eval_divergence_on_a_hand_written_stream():
    """Held-out reward falling while training reward rises is reward hacking; the tiny model's
    eval scores with the same reward as training on problems of the same kind, so no cheap
    real run shows it. A hand-written stream: training reward 0.2 -> 0.5, eval 0.40 -> 0.25."""
    train = [0.2, 0.3, 0.4, 0.5]
    evals = {2: 0.40, 4: 0.25}
    stream = {
        s: {metrics.REWARD: r, **({metrics.EVAL_REWARD: evals[s]} if s in evals else {})}
        for s, r in enumerate(train, start=1)
    }
    assert monitor_warnings(stream) == {"train_eval_divergence": 4}
    steady = {
        s: {metrics.REWARD: r, metrics.EVAL_REWARD: 0.4} for s, r in enumerate(train, start=1)
    }
    assert monitor_warnings(steady) == {}
