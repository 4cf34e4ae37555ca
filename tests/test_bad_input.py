"""The bad-input table of docs/sweeping.md: each row's command fails before any trial starts, with
the message shown there, and leaves no study and no MLflow store behind."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch
from conftest import compose_conf, needs_trl, sweep_env

from trainer.sampling.tiny_model import build_tiny_model

# (extra environment, sweep arguments, the line the user reads)
ROWS = [
    ({}, ["temperature=0.7,0"], "error: temperature=0.0: must be in (0, 10); 0.6-1.0 is typical (at temperature=0)"),
    ({}, ["lr=0"], "error: lr=0: must be > 0"),
    ({}, ["num_substeps=3"], "error: num_substeps=3: batch_size=32 must be divisible by num_substeps"),
    ({}, ["group_size=1,2"], "error: group_size=1: must be >= 2"),
    ({}, ["kl_penalty_coef=-0.1"], "error: kl_penalty_coef=-0.1: must be >= 0"),
    ({}, ["loss=reinforce"], "In 'config': Could not find 'loss/reinforce'"),
    ({}, ["lr_typo=1e-3,1e-2"], "error: lr_typo=1e-3,1e-2: no such setting (closest: lr)"),
    ({}, ["lrr=1e-3"], "error: lrr=1e-3: no such setting (closest: lr)"),
    ({}, ["+lrr=1e-3"], "error: +lrr=1e-3: nothing reads lrr (closest: lr)"),
    ({}, ["group_size=4", "lr=1e-3", "temprature=0.7"], "error: temprature=0.7: no such setting (closest: temperature)"),
    ({}, ["+hydra.sweeper.forcast_level=0.5"], "error: +hydra.sweeper.forcast_level=0.5: nothing reads hydra.sweeper.forcast_level (closest: hydra.sweeper.forecast_level)"),
    ({}, ["group_size=2,4", "group_size=2"], "error: group_size is given twice (group_size=2,4 and group_size=2); keep one"),
    ({}, ["lr=interval(1e-3)"], "Error parsing override 'lr=interval(1e-3)'"),
    ({}, ["lr=interval(1e-2,1e-3)"], "error: lr=interval(1e-2,1e-3): interval bounds must satisfy low < high"),
    ({}, ["lr=tag(log, interval(0, 1e-3))"], "error: lr=tag(log, interval(0, 1e-3)): a log interval must stay above 0"),
    ({}, ["lr=1e-3,2e-3,3e-3", "hydra.sweeper.max_grid_size=2"], "error: hydra.sweeper.max_grid_size=2: the grid has 3 points"),
    ({}, ["lr=1e-3,2e-3", "hydra.sweeper.terminator=true"], "error: hydra.sweeper.terminator=true: only a search (tpe, gp, random, cmaes) can stop early; a grid runs each of its points once"),
    ({}, ["lr=interval(1e-3,1e-2)", "hydra.sweeper.terminator=true", "hydra.sweeper.n_trials=3"], "error: hydra.sweeper.terminator_min_trials=5: must be <= n_trials=3, or the terminator never looks"),
    ({}, ["hydra.sweeper.terminator_min_trials=1"], "error: hydra.sweeper.terminator_min_trials=1: must be >= 2 (a fit needs 2 points)"),
    ({}, ["hydra.sweeper.storage=foo"], "error: hydra.sweeper.storage='foo': not a database URL"),
    ({}, ["hydra.sweeper.storage=postgresql://nobody@127.0.0.1:9/optuna"], "error: hydra.sweeper.storage='postgresql://nobody@127.0.0.1:9/optuna': cannot open it"),
    ({}, ["hydra.sweeper.storage=postgresql+pg8000://nobody@127.0.0.1:9/optuna"], "error: hydra.sweeper.storage='postgresql+pg8000://nobody@127.0.0.1:9/optuna': needs the pg8000 driver, which is not installed (pip install 'pg8000')"),
    ({"MLFLOW_TRACKING_URI": "postgresql+pg8000://nobody@127.0.0.1:9/mlflow"}, [], "error: MLFLOW_TRACKING_URI='postgresql+pg8000://nobody@127.0.0.1:9/mlflow': needs the pg8000 driver"),
    ({"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}, [], "error: MLFLOW_TRACKING_URI='http://127.0.0.1:9': cannot use this tracking store"),
    ({}, ["model.path=/no/such/model"], "error: model.path='/no/such/model': must be a Hugging Face model directory that exists"),
    ({}, ["task=jsonl", "task.path=/no/such.jsonl"], "error: task.path='/no/such.jsonl': no such file or directory"),
    ({}, ["task=jsonl", "task.path=BAD_JSONL"], "error: task.path='BAD_JSONL': line 2 is not JSON"),
    ({}, ["task=jsonl", "task.path=QA_JSONL", "task.prompt_field=question"], "error: task.prompt_field='question': row 1 of 'QA_JSONL' has no such field; its fields are ['answer', 'prompt']"),
    ({}, ["task=jsonl", "task.path=CHAT_JSONL"], "error: task.path='CHAT_JSONL': row 1, field 'prompt': unknown message role 'robot'"),
    ({}, ["task=jsonl", "task.path=BLANK_PROMPT_JSONL"], "error: task.path='BLANK_PROMPT_JSONL': row 2, field 'prompt': is empty; every row needs a prompt"),
    ({}, ["task=jsonl", "task.path=BLANK_ANSWER_CSV"], "error: task.path='BLANK_ANSWER_CSV': row 2, field 'answer': is empty; every row needs a reference answer"),
    ({}, ["model.path=EMPTY_DIR"], "error: model.path='EMPTY_DIR': no config.json there: not a Hugging Face model directory"),
    ({}, ["model.path=CONFIG_ONLY_DIR"], "error: model.path='CONFIG_ONLY_DIR': no weights there (one of model.safetensors, model.safetensors.index.json, pytorch_model.bin)"),
    ({}, ["model.path=CUT_WEIGHTS_DIR"], "error: model.path='CUT_WEIGHTS_DIR': model.safetensors does not read (ValueError: its tensors lie past the end of the file (cut short?))"),
    ({}, ["model.path=NO_TOKENIZER_DIR"], "error: model.path='NO_TOKENIZER_DIR': its tokenizer does not load (ValueError: Couldn't instantiate the backend tokenizer"),
    ({}, ["model.path=TINY_DIR", "task.chat_template=true"], "error: task.chat_template=True: the tokenizer of model.path='TINY_DIR' has none"),
    ({}, ["task.rewards=[exact]"], "error: task.rewards: unknown reward 'exact'; one of ['answer_tag', 'boxed',"),
    ({}, ["task.rewards=[last_number,format]", "task.reward_weights=[1.0]"], "error: task.reward_weights=[1.0]: 1 weights for 2 rewards ['last_number', 'format']"),
    ({}, ["hydra.sweeper.pruner=forcast"], "Error merging override hydra.sweeper.pruner=forcast"),
    ({}, ["hydra.sweeper.forecast_level=1.5"], "error: hydra.sweeper.forecast_level=1.5: must be in (0, 1)"),
    ({}, ["hydra.sweeper.pack=0"], "error: hydra.sweeper.pack=0: must be an integer >= 1, or auto (K from the batch and the device)"),
    ({}, ["hydra.sweeper.pack=fast"], "error: hydra.sweeper.pack='fast': must be an integer >= 1, or auto (K from the batch and the device)"),
    ({}, ["hydra.sweeper.health=[{name: kl, metric: kl_pre_post_v2, action: stop}]"], "error: hydra.sweeper.health[0].action='stop': must be one of prune, warn"),
    ({}, ["backend=trl", "kl_penalty_coef=0.1"], "error: kl_penalty_coef=0.1: backend=trl cannot: ours folds the KL into the advantage, TRL's beta is a loss term; sweep backend.grpo.beta instead"),
    ({}, ["backend=trl", "+backend.grpo.use_vlm=true"], "error: backend.grpo.use_vlm: not an option of TRL's GRPOConfig; did you mean use_vllm?"),
    ({}, ["backend=trl", "task.rewards=[{_target_:no.such.fn,style:trl}]"], "error: task.rewards: cannot import _target_='no.such.fn' (ModuleNotFoundError: No module named 'no')"),
    ({}, ["backend=trl", "backend.processes=0"], "error: backend.processes=0: must be >= 1"),
    ({}, ["backend=trl", "+backend.grpo.generation_kwargs={temperature:0.5}"], "error: backend.grpo.generation_kwargs.temperature=0.5: backend=trl sets it from temperature; set that instead"),
    ({}, ["backend=trl", "+backend.grpo.model_init_kwargs={dtype:bfloat16}"], "error: backend.grpo.model_init_kwargs.dtype='bfloat16': backend=trl sets it from model.dtype; set that instead"),
    ({}, ["+backend.grpo.beta=0.04"], "error: backend.grpo={'beta': 0.04}: TRL's GRPOConfig options apply to backend=trl only"),
    ({}, ["backend.processes=2"], "error: backend.processes=2: backend=ours trains in one process: use backend=trl for a run over several"),
    ({}, ["task.reward_timeout=-1"], "error: task.reward_timeout=-1: must be a number of seconds >= 0 (0: no limit)"),
]  # fmt: skip


def model_dirs(root: Path) -> dict[str, Path]:
    """Model directories that exist but cannot load, and the tiny model (it has no chat
    template)."""
    dirs = {name: root / name.lower() for name in MODEL_DIRS}
    for folder in dirs.values():
        folder.mkdir()
    config = {"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1,
              "num_attention_heads": 1, "intermediate_size": 8, "vocab_size": 16}  # fmt: skip
    for name in ("CONFIG_ONLY_DIR", "CUT_WEIGHTS_DIR", "NO_TOKENIZER_DIR"):
        (dirs[name] / "config.json").write_text(json.dumps(config))
    weights = safetensors.torch.save({"lm_head.weight": torch.zeros(16, 8)})
    (dirs["NO_TOKENIZER_DIR"] / "model.safetensors").write_bytes(weights)
    (dirs["CUT_WEIGHTS_DIR"] / "model.safetensors").write_bytes(weights[:-100])
    dirs["TINY_DIR"] = build_tiny_model(compose_conf().model.tiny)
    return dirs


MODEL_DIRS = ("EMPTY_DIR", "CONFIG_ONLY_DIR", "CUT_WEIGHTS_DIR", "NO_TOKENIZER_DIR")


# Rows whose check reads TRL's GRPOConfig fields from its source: they need trl installed.
NEEDS_TRL = {"+backend.grpo.use_vlm=true"}


@pytest.mark.parametrize(
    ("env", "args", "message"),
    [pytest.param(*row, marks=[needs_trl] if NEEDS_TRL & set(row[1]) else []) for row in ROWS],
    ids=[" ".join(r[1]) or str(r[0]) for r in ROWS],
)
def test_bad_input_fails_before_any_trial(tmp_path, env, args, message):
    bad_jsonl = tmp_path / "bad.jsonl"
    bad_jsonl.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n{broken\n")
    files = {
        "BAD_JSONL": bad_jsonl,
        "QA_JSONL": tmp_path / "qa.jsonl",
        "CHAT_JSONL": tmp_path / "chat.jsonl",
    }
    files.update(model_dirs(tmp_path))
    files["QA_JSONL"].write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    files["BLANK_PROMPT_JSONL"] = tmp_path / "blank_prompt.jsonl"
    files["BLANK_PROMPT_JSONL"].write_text(
        '{"prompt": "1+1=", "answer": 2}\n{"prompt": " ", "answer": 4}\n'
    )
    files["BLANK_ANSWER_CSV"] = tmp_path / "blank_answer.csv"
    files["BLANK_ANSWER_CSV"].write_text("prompt,answer\n1+1=,2\n2+2=,\n3+3=,6\n")
    robot = {"prompt": [{"role": "robot", "content": "1+1="}], "answer": "2"}
    files["CHAT_JSONL"].write_text(json.dumps(robot) + "\n")
    for name, path in files.items():
        args = [a.replace(name, str(path)) for a in args]
        message = message.replace(name, str(path))
    environment = {**sweep_env(tmp_path, store=False), **env}
    done = subprocess.run(
        [sys.executable, "-m", "sweeper", "-m", *args],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    # Our errors are one line, the last; Hydra's own (a missing config option, a malformed
    # override) begin with theirs.
    shown = lines[-1] if message.startswith("error:") else lines[0]
    assert shown.startswith(message), done.stderr[-2000:]
    assert not (tmp_path / "sweeps.db").exists() and not (tmp_path / "mlflow.db").exists()
    assert not (tmp_path / "tuned").exists()
    assert not {"outputs", "multirun", "mlruns"} & {p.name for p in tmp_path.iterdir()}
    if message.startswith("error:"):
        assert len(lines) == 1, done.stderr[-2000:]  # the error and nothing else


@pytest.mark.parametrize("cli", [["sweeper", "-m"], ["trainer"]])
def test_a_bad_input_fails_before_mlflow_peft_transformers_and_the_trainer_load(tmp_path, cli):
    """The settings are checked with light imports (Hydra, Optuna, torch): MLflow, PEFT and
    transformers take seconds to import and load only once the settings hold."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", *cli, "lr=0"],
        cwd=tmp_path, capture_output=True, text=True, timeout=180,
        env=sweep_env(tmp_path),
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == "error: lr=0: must be > 0"
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert imported, "python -X importtime printed no imports"
    assert {"mlflow", "peft", "transformers", "trainer.run.train"}.isdisjoint(imported)
