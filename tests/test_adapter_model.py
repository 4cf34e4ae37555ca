"""`python -m analysis best --log-model`: the best configuration's LoRA adapter, from a real
sweep's trial, logged as an MLflow model under the study's run and naming its base model
(path and sha256); it loads back with MLflow and generates the same tokens as the trial's
final adapter; `analysis best` then says how to load it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import run_sweep, study_in, study_uri, sweep_env

from analysis.adapter_model import (
    BASE_HASH_TAG,
    BASE_PATH_TAG,
    base_model_sha256,
    model_tags,
)
from records.sweep import StudyAttr, Tag, replicates


def greedy_tokens(model, tokenizer, prompt: str) -> list[int]:
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=6, do_sample=False)
    return out[0, ids.shape[1] :].tolist()


@pytest.mark.slow
def test_the_best_adapter_is_an_mlflow_model_that_generates_the_trials_tokens(tmp_path):
    done = run_sweep(tmp_path, "lr=5e-3", "max_steps=3", "eval_every=3")
    assert done.returncode == 0, done.stderr[-3000:]
    env = {**sweep_env(tmp_path)}
    best = subprocess.run(
        [sys.executable, "-m", "analysis", "best", "--log-model", "--storage", study_uri(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert best.returncode == 0, best.stderr[-3000:]
    (line,) = [x for x in best.stdout.splitlines() if x.startswith("# adapter model: ")]
    uri = line.split()[3]
    assert uri.startswith("models:/")

    import mlflow
    from mlflow.tracking import MlflowClient
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    study = study_in(tmp_path)
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    parent = client.get_run(study.user_attrs[StudyAttr.MLFLOW_PARENT_RUN_ID])
    assert parent.data.tags[Tag.ADAPTER_MODEL] == uri and parent.info.status == "FINISHED"
    (seed,) = replicates(study.best_trial)
    adapter = os.path.join(seed.output_dir, "adapter")
    tags = model_tags(client, uri)
    base = tags[BASE_PATH_TAG]
    assert tags[BASE_HASH_TAG] == base_model_sha256(Path(base))

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    loaded = mlflow.transformers.load_model(uri, return_type="components")
    trial = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)
    tokenizer = AutoTokenizer.from_pretrained(adapter)
    from peft import get_peft_model_state_dict

    ours, theirs = get_peft_model_state_dict(loaded["model"]), get_peft_model_state_dict(trial)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert any(v.abs().sum() > 0 for k, v in ours.items() if "lora_B" in k)  # trained, not init
    for prompt in ("12+34=", "7+45="):
        assert greedy_tokens(loaded["model"], loaded["tokenizer"], prompt) == greedy_tokens(
            trial, tokenizer, prompt
        )

    again = subprocess.run(
        [sys.executable, "-m", "analysis", "best", "--storage", study_uri(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0 and line in again.stdout.splitlines()
