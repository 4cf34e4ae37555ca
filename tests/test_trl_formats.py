"""TRL's dataset formats on both backends: a conversational dataset (a `prompt` column of
messages with a system message, a `solution` column) swept with rewards written as TRL's
documentation writes them, reading `completion[0]["content"]` and the row's `solution`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import needs_trl, run_sweep, study_in, sweep_env
from mlflow.tracking import MlflowClient

from records.sweep import TrialAttr

TESTS = Path(__file__).parent
SYSTEM = {"role": "system", "content": "You add numbers."}
TRL_DOC_REWARDS = (
    "task.rewards=[{_target_:user_rewards.accuracy_reward,style:trl},"
    "{_target_:user_rewards.think_format_reward,style:trl}]"
)


def conversational_rows(n: int) -> list[dict]:
    return [
        {"prompt": [SYSTEM, {"role": "user", "content": f"{i}+{i + 1}="}], "solution": 2 * i + 1}
        for i in range(n)
    ]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@needs_trl
@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny", pytest.param("smollm2", marks=pytest.mark.real_model)])
def test_a_conversational_dataset_sweeps_on_both_backends(tmp_path, model, request):
    """One sweep, a trial a backend: both COMPLETE, each reward logged at each step, and every
    call the reward got was TRL's conversational shape (message lists, the system message
    first; completions as [{"role": "assistant", ...}]). On the tiny model and on SmolLM2, a
    real instruct model with its own chat template."""
    data = write_jsonl(tmp_path / "conv.jsonl", conversational_rows(24))
    on_model = []
    if model == "smollm2":
        smollm2 = request.getfixturevalue("smollm2")
        on_model = [f"model.path={smollm2}", "model.dtype=float32", "max_tokens=16"]
    seen = tmp_path / "seen.jsonl"
    env = {**sweep_env(tmp_path), "REWARD_SEEN": str(seen)}
    env["PYTHONPATH"] = f"{TESTS}:{env.get('PYTHONPATH', '')}"
    done = run_sweep(
        tmp_path, "backend=ours,trl", "task=jsonl", f"task.path={data}",
        "task.answer_field=solution", TRL_DOC_REWARDS, "batch_size=4", "group_size=2",
        "max_steps=2", "eval_every=0", "task.eval_fraction=0.2", *on_model, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    backends = set()
    for trial in study_in(tmp_path).trials:
        assert trial.state.name == "COMPLETE"
        run = client.get_run(trial.user_attrs[TrialAttr.MLFLOW_RUN_ID])
        backends.add(run.data.params["backend"])
        for name in ("accuracy_reward", "think_format_reward"):
            history = client.get_metric_history(run.info.run_id, f"reward/{name}")
            assert sorted(m.step for m in history) == [1, 2]
    assert backends == {"ours", "trl"}
    calls = [json.loads(line) for line in seen.read_text().splitlines()]
    assert any(len(call["completions"]) == 8 for call in calls)  # TRL's batched training call
    for call in calls:
        assert all(prompt[0] == SYSTEM and len(prompt) == 2 for prompt in call["prompts"])
        assert all(
            len(c) == 1 and c[0]["role"] == "assistant" and isinstance(c[0]["content"], str)
            for c in call["completions"]
        )
