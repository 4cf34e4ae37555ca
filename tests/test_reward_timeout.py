"""task.reward_timeout: a reward that never returns scores 0 and is counted, in real runs."""

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import needs_trl, sweep_env
from mlflow import MlflowClient

from records import metrics as metrics_names
from trainer.env.reward_worker import bound
from trainer.env.rewards import RewardError, RewardSet
from trainer.env.tasks import Problem
from trainer.run.train import train

TESTS = str(Path(__file__).parent)
# 4 baseline-eval calls (4 problems, one sampled, no greedy), then 8 a step.
SMALL = ["batch_size=4", "group_size=2", "task.eval_size=4", "eval_greedy=false", "eval_every=0"]
WARNING = "took longer than task.reward_timeout=1s"


def run_trainer(cwd: Path, *overrides: str, hang_at: str = "") -> subprocess.CompletedProcess:
    env = {**sweep_env(cwd), "HANG_AT": hang_at}
    env["PYTHONPATH"] = f"{TESTS}:{env.get('PYTHONPATH', '')}"
    command = [sys.executable, "-m", "trainer", f"hydra.run.dir={cwd}/run", *SMALL, *overrides]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ours", pytest.param("trl", marks=needs_trl)])
def test_a_hung_reward_times_out_scores_zero_and_the_run_finishes(tmp_path, backend):
    # Both backends score a step's 8 rollouts in one batch after the 4 baseline-eval calls:
    # calls 6 and 15 fall in steps 1 and 2.
    done = run_trainer(
        tmp_path, f"backend={backend}", "max_steps=3", "task.reward_timeout=1",
        "task.rewards=[{_target_:user_rewards.hangs_twice}]", hang_at="6,15",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert output.count(WARNING) == 1, output[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs(client.search_experiments()[0].experiment_id)
    assert run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, metrics_names.REWARD_TIMEOUTS)
    assert {m.step: m.value for m in history} == {1: 1.0, 2: 1.0, 3: 0.0}


@pytest.mark.slow
def test_a_reward_that_always_hangs_stops_the_run_in_one_line(tmp_path):
    done = run_trainer(
        tmp_path, "max_steps=3", "task.reward_timeout=0.2", "task.rewards=[{_target_:user_rewards.hangs}]"
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "error: reward 'hangs' timed out (task.reward_timeout=0.2s) on 9 of its last 9 calls: "
        "it hangs; fix it, or raise task.reward_timeout"
    )


@pytest.mark.slow
@pytest.mark.parametrize("rewards", ["[exact_match]", "[{_target_:user_rewards.exact}]"])
def test_a_timeout_that_never_fires_changes_no_number(composed, new_recorder, rewards, monkeypatch):
    """The default task (its reward in process) and a user's reward (in the worker) train
    to the same numbers with the timeout on and off; only the count is added."""
    monkeypatch.syspath_prepend(TESTS)
    runs = []
    for timeout in (5, 0):
        recorder = new_recorder()
        train(composed(*SMALL, "max_steps=2", f"task.rewards={rewards}",
                       f"task.reward_timeout={timeout}"), recorder)  # fmt: skip
        runs.append(recorder.steps)
    bounded, free = runs
    for step in free:
        timing = {k for k in free[step] if k.startswith(("time/", "throughput/"))}
        counted = {k: v for k, v in bounded[step].items() if k not in timing}
        if rewards != "[exact_match]" and step > 0:
            assert counted.pop(metrics_names.REWARD_TIMEOUTS) == 0.0
        assert counted == {k: v for k, v in free[step].items() if k not in timing}


def test_trl_style_and_our_style_calls_in_the_worker(monkeypatch):
    """A TRL-style reward is called with TRL's keyword lists in the worker; a hung call scores
    each completion 0; one of ours that raises still raises RewardError naming it."""
    monkeypatch.syspath_prepend(TESTS)
    rewards = RewardSet([
        {"_target_": "user_rewards.hangs_trl", "style": "trl"},
        {"_target_": "user_rewards.broken"},
    ])  # fmt: skip
    bound(rewards, 0.2)
    styled, ours = rewards.fns
    trl = styled.fn  # TRL's batched call, in the worker; `styled` calls it as ours
    assert trl(prompts=["1+1="], completions=["2", "3"], completion_ids=[[1], [2]]) == [0.0, 0.0]
    with pytest.raises(RewardError, match=r"^reward 'broken' raised KeyError: 'no_such_key'"):
        ours(Problem(prompt="1+1=", answer="2"), "2", True)
    rewards.worker.close()
