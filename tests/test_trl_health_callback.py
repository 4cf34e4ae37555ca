"""Our health rules in a plain TRL script: docs/examples/trl_health_callback.py, a GRPOTrainer
script of a user's own with `trainer.add_callback(HealthCallback(trainer))`, on SmolLM2 with a
breaking lr, stops at the step and with the reason the sweep's monitor gives on the same run
(replayed by `python -m analysis rules --experiment` over what TRL logged to MLflow), keeps
its state at that step, and writes the breach to TRL's MLflow run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import needs_trl

from records.sweep import Tag
from trainer.backends.trl.checkpoints import HEALTH

pytestmark = needs_trl

EXAMPLE = Path(__file__).parents[1] / "docs" / "examples" / "trl_health_callback.py"
EXPERIMENT = "plain-trl"


@pytest.mark.slow
@pytest.mark.real_model
def test_a_plain_trl_script_stops_where_the_sweep_would_prune_with_its_reason(tmp_path, smollm2):
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
        "MLFLOW_EXPERIMENT_NAME": EXPERIMENT,
    }
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--model", str(smollm2), "--lr", "3e-2",
         "--max-steps", "6", "--out", str(out), "--report-to", "mlflow"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    reason = done.stdout.strip().splitlines()[-1]
    assert reason.startswith("post_update_kl: kl_pre_post_v2="), reason
    step = int(reason.split(" at step ")[1].split()[0])
    assert step < 6  # stopped before max_steps
    assert f"health stop: {reason}" in done.stderr
    assert (out / f"checkpoint-{step}" / HEALTH).is_file()  # the state at the breach, kept
    assert not (out / f"checkpoint-{step + 1}").exists()

    from mlflow.tracking import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])
    assert run.data.tags[Tag.PRUNE_REASON] == reason
    assert "kl_pre_post_v2" in run.data.metrics and "reward" in run.data.metrics  # ours, TRL's

    replayed = subprocess.run(
        [sys.executable, "-m", "analysis", "rules", "--experiment", EXPERIMENT],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert replayed.returncode == 0, replayed.stderr[-2000:]
    (line,) = [x for x in replayed.stdout.splitlines() if x.startswith("  ")]
    assert f"post_update_kl at step {step} of {step}, 0 steps saved: {reason}" in line


def tiny_trainer(output_dir: Path, health, max_steps: int, **config):
    """A plain GRPOTrainer on the shipped tiny model, with `health` in its callbacks."""
    from conftest import compose_conf
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from trainer.sampling.model_source import model_path

    args = GRPOConfig(
        output_dir=str(output_dir), learning_rate=1e-3, max_steps=max_steps, num_generations=4,
        per_device_train_batch_size=4, max_completion_length=4, logging_steps=1,
        report_to="none", use_cpu=True, bf16=False, **config,
    )  # fmt: skip
    return GRPOTrainer(
        model=model_path(compose_conf()),
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_list([{"prompt": f"{i}+{i}="} for i in range(8)]),
        callbacks=[health],
    )


def any_reward(patience: int = 1):
    """A rule of one's own that fires on every logged step, after `patience` of them."""
    from trainer.run.health import Check, HealthRule

    return HealthRule("reward_seen", "reward/mean", Check.above, -1.0, patience, advice="any")


@pytest.mark.slow
def test_callbacks_list_form_stops_on_a_rule_of_ones_own_and_names_the_rules_it_cannot_run(
    tmp_path, caplog
):
    """`GRPOTrainer(..., callbacks=[HealthCallback(rules=...)])` on the tiny model: a rule of
    one's own on TRL's logged reward stops the run at step 1 with its line; the KL rule,
    which needs the trainer, is named once as one that never fires."""
    from trainer.backends.trl.health_callback import HealthCallback
    from trainer.run.health import default_rules

    health = HealthCallback(rules=[any_reward(), default_rules()[0]])
    trainer = tiny_trainer(tmp_path / "run", health, max_steps=4, save_strategy="no")
    with caplog.at_level("WARNING", logger="trainer.backends.trl.health_callback"):
        trainer.train()
    assert trainer.state.global_step == 1
    assert str(health.breach) == "reward_seen: reward/mean=0 > -1 at step 1 (any)"
    (never,) = [r.getMessage() for r in caplog.records if "never fire" in r.getMessage()]
    assert "post_update_kl (kl_pre_post_v2)" in never
    assert (tmp_path / "run" / "checkpoint-1" / HEALTH).is_file()


@pytest.mark.slow
def test_a_resumed_run_decides_as_one_never_stopped(tmp_path):
    """A rule with patience 3 over a run saved at step 2 and resumed from that checkpoint
    fires at step 3, as straight through: the rules' streak is restored with the state."""
    from trainer.backends.trl.health_callback import HealthCallback

    out = tmp_path / "run"
    first = HealthCallback(rules=[any_reward(patience=3)])
    tiny_trainer(out, first, max_steps=2, save_strategy="steps", save_steps=1).train()
    assert first.breach is None and (out / "checkpoint-2" / HEALTH).is_file()
    again = HealthCallback(rules=[any_reward(patience=3)])
    resumed = tiny_trainer(out, again, max_steps=6, save_strategy="steps", save_steps=1)
    resumed.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert again.breach is not None and again.breach.step == 3
    assert resumed.state.global_step == 3
