"""Both kinds of checkpoint. gradient_checkpointing=true: the same gradients, on the learner's
merged copy (its custom backward) and through the shared prompt cache, which transformers'
checkpointing would drop. Resume checkpoints (save_every): nothing planted in one runs code,
and a bad one is refused for the one before."""

import hashlib
import json
import logging
import pickle
import random
import shutil
import struct
from pathlib import Path

import optuna
import pytest
import safetensors.torch
import torch
from conftest import Recorder, compose_conf
from mlflow.tracking import MlflowClient

from records.metrics import EVAL_REWARD
from records.sweep import State, StudyAttr, Tag, replicates
from sweeper.sweep import job
from trainer.backends import resumed_step
from trainer.model import packing
from trainer.model.fast_logprobs import token_logprobs
from trainer.model.token_batch import collate
from trainer.run import checkpoint
from trainer.run.lr import make_scheduler
from trainer.run.train import train
from trainer.sampling.model_source import load_policy
from trainer.sampling.protocol import SamplingSettings
from trainer.sampling.torch_sampler import TorchSampler

PROMPTS = ["12+34=", "7+45=", "99+1="]


def float64_policy(checkpointing: bool):
    torch.manual_seed(0)  # the same LoRA initialisation in both
    cfg = compose_conf("output_dir=/tmp/unused", f"gradient_checkpointing={checkpointing}")
    policy = load_policy(cfg)
    policy.model.double()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # LoRA B starts at zero, which would hide a wrong adapter gradient
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return policy


@pytest.mark.parametrize("path", ["packed", "shared-cache"])
def test_checkpointing_gives_the_same_log_probs_and_gradients(monkeypatch, path):
    monkeypatch.setattr(packing, "MAX_ROW_TOKENS", 10_000 if path == "packed" else 0)
    plain, checkpointed = float64_policy(False), float64_policy(True)
    rollouts = TorchSampler(plain).sample(
        [p for p in PROMPTS for _ in range(3)], SamplingSettings()
    )
    batch = collate(rollouts, plain.tokenizer.pad_token_id)
    results = []
    for policy in (plain, checkpointed):
        with policy.learner() as model:
            logp_NT, _ = token_logprobs(model, batch, 1.0)
        logp_NT.mul(batch.mask_NT).sum().backward()
        results.append((logp_NT.detach(), [p.grad for p in policy.trainable_parameters()]))
    (plain_NT, plain_grads), (checkpointed_NT, checkpointed_grads) = results
    assert checkpointed.model.get_base_model().model.layers[0].gradient_checkpointing
    assert torch.allclose(checkpointed_NT, plain_NT, rtol=0, atol=1e-12)
    for c, p in zip(checkpointed_grads, plain_grads, strict=True):
        assert torch.allclose(c, p, rtol=1e-9, atol=1e-12)
    assert any(g.abs().max() > 0 for g in plain_grads)


# --- resume checkpoints: nothing in one can run code, a bad one is refused -------------------
# Checkpoints live in the sweep's shared output directory: whoever can write there must not be
# able to make a resuming worker run code, and a broken file must not stop the worker.

SMALL = ["batch_size=4", "group_size=2", "task.eval_size=16", "eval_every=0"]


class Planted:
    """A pickle that, when unpickled, creates `marker` (open(marker, "w"))."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def planted_bytes(marker: Path) -> bytes:
    return pickle.dumps(Planted(marker))


def test_the_planted_pickle_runs_code_when_unpickled(tmp_path):
    """The control: the payload the tests below plant is live."""
    pickle.loads(planted_bytes(tmp_path / "control"))
    assert (tmp_path / "control").exists()


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> Path:
    """A real 4-step run with checkpoints after steps 2 and 4."""
    root = tmp_path_factory.mktemp("saved")
    cfg = compose_conf(f"output_dir={root}/run", *SMALL, "max_steps=4", "save_every=2")
    train(cfg)
    return root / "run"


def _rehash(folder: Path) -> None:
    """state.json's sha256 made to match the (planted) tensors file, as an attacker would."""
    state = json.loads((folder / checkpoint.STATE).read_text())
    state["tensors_sha256"] = hashlib.sha256((folder / checkpoint.TENSORS).read_bytes()).hexdigest()
    (folder / checkpoint.STATE).write_text(json.dumps(state))


def _edit_state(folder: Path, edit) -> None:
    state = json.loads((folder / checkpoint.STATE).read_text())
    edit(state)
    (folder / checkpoint.STATE).write_text(json.dumps(state))


def _lying_safetensors(folder: Path, marker: Path) -> None:
    """A safetensors header claiming a tensor far past the file's end."""
    header = json.dumps(
        {"trainable/x": {"dtype": "F32", "shape": [10**9], "data_offsets": [0, 4 * 10**9]}}
    ).encode()
    (folder / checkpoint.TENSORS).write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    _rehash(folder)


def _pickle_as_old_format(folder: Path, marker: Path) -> None:
    (folder / checkpoint.STATE).unlink()
    (folder / checkpoint.TENSORS).unlink()
    (folder / "state.pt").write_bytes(planted_bytes(marker))


def _pickle_as_tensors(folder: Path, marker: Path) -> None:
    (folder / checkpoint.TENSORS).write_bytes(planted_bytes(marker))
    _rehash(folder)


def _wrong_shape_weight(folder: Path, marker: Path) -> None:
    tensors = safetensors.torch.load((folder / checkpoint.TENSORS).read_bytes())
    name = next(k for k in tensors if k.startswith("trainable/"))
    tensors[name] = torch.zeros(3, 3)
    (folder / checkpoint.TENSORS).write_bytes(safetensors.torch.save(tensors))
    _rehash(folder)


PLANTS = {
    "pickle as the old state.pt": _pickle_as_old_format,
    "pickle as the tensors file": _pickle_as_tensors,
    "pickle as state.json": lambda f, m: (f / checkpoint.STATE).write_bytes(planted_bytes(m)),
    "lying safetensors header": _lying_safetensors,
    "truncated tensors file": lambda f, m: (f / checkpoint.TENSORS).write_bytes(
        (f / checkpoint.TENSORS).read_bytes()[:1000]
    ),
    "scheduler attribute injected": lambda f, m: _edit_state(
        f, lambda s: s["scheduler"].update(optimizer="hijacked")
    ),
    "deeply nested json": lambda f, m: (f / checkpoint.STATE).write_text("[" * 100_000),
    "python rng of the wrong size": lambda f, m: _edit_state(
        f, lambda s: s["python_rng"].__setitem__(1, [1, 2, 3])
    ),
    "weight of the wrong shape": _wrong_shape_weight,
    "step that is not the folder's": lambda f, m: _edit_state(f, lambda s: s.update(step=9)),
}


# Refused only against the live run (its model's shapes, its scheduler's keys): a sweep's guess
# before training names the newer step; its records are set once train() loads (test below).
FIT_ONLY = {"scheduler attribute injected", "weight of the wrong shape"}


@pytest.mark.slow
@pytest.mark.parametrize("plant", list(PLANTS))
def test_a_planted_checkpoint_is_refused_and_the_one_before_is_loaded(
    saved_run, tmp_path, caplog, plant
):
    output_dir = tmp_path / "run"
    shutil.copytree(saved_run, output_dir)
    newest = output_dir / "checkpoints" / "step_000004"
    marker = tmp_path / "marker"
    PLANTS[plant](newest, marker)
    cfg = compose_conf(f"output_dir={output_dir}", *SMALL, "max_steps=6")
    policy = load_policy(cfg)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-3, fused=True)
    scheduler = make_scheduler(cfg, optimizer)
    with caplog.at_level(logging.WARNING):
        assert checkpoint.resume(output_dir, policy, optimizer, scheduler, random.Random()) == 2
    if plant not in FIT_ONLY:  # what a sweep records before training, as train() will load
        assert checkpoint.resumable_step(output_dir) == 2
    assert not marker.exists()
    (line,) = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert str(newest) in line and "trying the one before" in line


@pytest.mark.slow
def test_with_every_checkpoint_refused_the_run_starts_at_step_0(saved_run, tmp_path, caplog):
    output_dir = tmp_path / "run"
    shutil.copytree(saved_run, output_dir)
    for folder in checkpoint.checkpoint_dirs(output_dir):
        _pickle_as_old_format(folder, tmp_path / "marker")
    cfg = compose_conf(f"output_dir={output_dir}", *SMALL, "max_steps=1", "resume=true")
    recorder = Recorder()
    with caplog.at_level(logging.WARNING):
        train(cfg, recorder)
    assert sorted(recorder.steps) == [0, 1]  # a baseline eval: a fresh start
    assert not (tmp_path / "marker").exists()
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 2 and all("old pickle-format state.pt" in r for r in refusals)


@pytest.mark.slow
def test_resume_past_a_planted_checkpoint_is_bit_identical_to_a_straight_run(saved_run, tmp_path):
    straight = Recorder()
    train(compose_conf(f"output_dir={tmp_path}/straight", *SMALL, "max_steps=6"), straight)
    output_dir = tmp_path / "run"
    shutil.copytree(saved_run, output_dir)
    _pickle_as_tensors(output_dir / "checkpoints" / "step_000004", tmp_path / "marker")
    resumed = Recorder()
    cfg = compose_conf(f"output_dir={output_dir}", *SMALL, "max_steps=6", "resume=true")
    result = train(cfg, resumed)
    assert not (tmp_path / "marker").exists()
    assert sorted(resumed.steps) == [3, 4, 5, 6]  # from step 2, the good one
    assert result.resumed_from_step == 2
    for step in (3, 4, 5, 6):
        assert resumed.steps[step]["reward/mean"] == straight.steps[step]["reward/mean"]
        assert resumed.steps[step]["loss"] == straight.steps[step]["loss"]


def _bound_trial(tmp_path: Path, output_dir: Path, *overrides: str):
    """A live trial of a one-trial study and a sweep job's config bound to it, resuming."""
    storage = f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.create_study(study_name="resume", storage=storage, direction="maximize")
    attrs = {
        StudyAttr.OBJECTIVE: EVAL_REWARD,
        StudyAttr.DIRECTION: "maximize",
        StudyAttr.HEALTH_RULES: [],
        StudyAttr.KL_THRESHOLD: 0.1,
        StudyAttr.PRUNER: "none",
        StudyAttr.PRUNER_WARMUP_STEPS: 0,
        StudyAttr.SEEDS: 1,
        StudyAttr.MLFLOW_TRACKING_URI: f"sqlite:///{tmp_path}/mlflow.db",
    }
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    trial = study.ask()
    binding = [f"trial.id={trial._trial_id}", f"trial.number={trial.number}"]
    binding += [f"trial.storage='{storage}'", "trial.study=resume"]
    cfg = compose_conf(
        f"output_dir={output_dir}", "resume=true", *binding, *overrides, config_name="sweep"
    )
    return study, cfg


@pytest.mark.slow
@pytest.mark.parametrize(
    "unfit, loaded", [(["step_000004"], 2), (["step_000004", "step_000002"], None)]
)
def test_a_sweep_trial_records_the_step_it_loaded_not_the_one_it_guessed(
    saved_run, tmp_path, unfit, loaded
):
    """A checkpoint that reads but does not fit the model passes the guess made before
    training; the MLflow tag and the seed's record then say what train() loaded."""
    output_dir = tmp_path / "run"
    shutil.copytree(saved_run, output_dir)
    for name in unfit:
        _wrong_shape_weight(output_dir / "checkpoints" / name, tmp_path / "marker")
    study, cfg = _bound_trial(tmp_path, output_dir, *SMALL, "max_steps=6")
    assert resumed_step(cfg) == 4  # the guess: the newest that reads
    job.run_trial(cfg)
    (seed_run,) = replicates(study.trials[0])
    assert seed_run.state == State.COMPLETE and seed_run.steps_run == 6
    assert seed_run.resumed_from_step == loaded
    tags = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(seed_run.run_id).data.tags
    assert tags.get(Tag.RESUMED_FROM_STEP) == (None if loaded is None else str(loaded))
