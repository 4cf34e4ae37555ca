"""A `trl grpo --config` YAML as a sweep's base (`backend=trl backend.config=...`): read with
TRL's own parser, the recipe's values over our defaults and the command line's over the
recipe's, what cannot be honoured refused in one line before any trial, and a swept recipe
whose runs record the file, whose tuned rerun keeps its other settings and whose tuned YAML
`trl grpo` reads back."""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import (
    compose_conf,
    needs_trl,
    run_sweep,
    study_in,
    study_uri,
    sweep_env,
    verdict_decision,
)

from analysis.__main__ import main as analysis_main
from records.sweep import TrialAttr
from trainer.backends import validate
from trainer.backends.trl.recipe import (
    RECIPE_HASH_PARAM,
    RECIPE_PARAM,
    explicit_keys,
    notes,
    recipe_params,
    with_recipe,
)
from trainer.base.errors import ConfigError
from trainer.env.reward_check import check_task_rewards
from trainer.sampling.model_source import model_path

pytestmark = needs_trl

TESTS = Path(__file__).parent
REWARD = "user_rewards.accuracy_reward"  # TRL's documentation's reward, by dotted path


@functools.cache  # composing the config to find it costs most of a recipe test's time
def tiny_dir() -> str:
    """The shipped tiny model's directory: a recipe names its model by path."""
    return model_path(compose_conf())


def conversational_data(root: Path, test_split: bool = True) -> Path:
    """A directory of data files, as `trl grpo` loads `dataset_name` (splits by file name)."""
    rows = [
        {"prompt": [{"role": "user", "content": f"{i:02d}+{i + 1:02d}="}], "solution": 2 * i + 1}
        for i in range(24)
    ]
    data = root / "data"
    data.mkdir()
    parts = {"train": rows[:20], "test": rows[20:]} if test_split else {"train": rows}
    for split, part in parts.items():
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return data


def write_recipe(root: Path, **fields) -> Path:
    if "dataset_name" not in fields:
        fields["dataset_name"] = str(conversational_data(root))
    recipe = {
        "model_name_or_path": tiny_dir(),
        "reward_funcs": [REWARD, "think_format_reward"],
        "use_peft": True,
        "lora_r": 4,
        "lora_target_modules": ["q_proj", "v_proj"],
        "num_generations": 4,
        "per_device_train_batch_size": 8,
        "max_completion_length": 8,
        "max_steps": 2,
        "use_cpu": True,
        "bf16": False,
        **fields,
    }
    path = root / "grpo.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in recipe.items() if v is not None}))
    return path


def resolved(recipe: Path, *overrides: str):
    given = ["backend=trl", f"backend.config={recipe}", *overrides]
    return with_recipe(compose_conf(*given), given)


def test_the_recipe_beats_our_defaults_and_the_command_line_beats_the_recipe(tmp_path):
    """The recipe's values (TRL's defaults included) where no override is given; a given one
    wins; the batch shape maps back exactly (8 rollouts a device x 2 steps per generation)."""
    recipe = write_recipe(
        tmp_path, learning_rate=0.002, steps_per_generation=2, max_steps=6, beta=0.04
    )
    cfg = resolved(recipe, "group_size=2", "+backend.grpo.weight_decay=0.1")
    assert cfg.lr == 0.002  # the recipe's, over our 2e-3 default
    assert cfg.group_size == 2  # the command line's, over the recipe's 4
    assert (cfg.batch_size, cfg.num_substeps, cfg.max_steps) == (8 * 2 // 4, 2, 3)
    assert cfg.backend.grpo.beta == 0.04 and cfg.backend.grpo.weight_decay == 0.1
    assert cfg.loss.name == "dapo"  # the recipe's (TRL's default)
    assert cfg.loss.clip_low == pytest.approx(0.8) and cfg.loss.clip_high == pytest.approx(1.2)
    assert cfg.gradient_checkpointing is True  # TRL's default
    assert (cfg.lora_rank, cfg.lora_alpha) == (4, 32)  # lora_alpha: ModelConfig's default
    assert cfg.model.path == tiny_dir() and cfg.model.device == "cpu"
    assert cfg.task.rewards[0]["_target_"] == REWARD
    assert cfg.task.rewards[1]["_target_"] == "trl.rewards.think_format_reward"
    assert validate(cfg)  # the full checks pass (warnings only)
    plain = tmp_path / "plain"
    plain.mkdir()
    assert resolved(write_recipe(plain)).lr == 1e-6  # GRPOConfig's default learning_rate


def test_trl_names_override_and_one_field_set_twice_is_refused(tmp_path):
    recipe = write_recipe(tmp_path, learning_rate=0.002)
    cfg = resolved(recipe, "+backend.grpo.learning_rate=2e-4", "+backend.grpo.beta=0.1")
    assert cfg.lr == 2e-4 and "learning_rate" not in cfg.backend.grpo
    assert cfg.backend.grpo.beta == 0.1
    with pytest.raises(ConfigError) as refused:
        resolved(recipe, "lr=1e-4", "+backend.grpo.learning_rate=2e-4")
    assert str(refused.value) == (
        "backend.grpo.learning_rate and lr: both set learning_rate; give one of them"
    )


def test_a_tuned_file_counts_as_the_command_line(tmp_path, monkeypatch):
    """`python -m trainer +tuned=<study>`: the tuned file's keys win over the recipe."""
    (tmp_path / "tuned").mkdir()
    (tmp_path / "tuned" / "s.yaml").write_text("# @package _global_\nlr: 0.0005\n")
    monkeypatch.chdir(tmp_path)
    assert "lr" in explicit_keys(["+tuned=s", "backend=trl"])


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"dataset_name": "trl-lib/DeepMath-103K"}, "dataset_name='trl-lib/DeepMath-103K'"),
        ({"datasets": [{"path": "x"}]}, "datasets="),
        ({"reward_model_name_or_path": "/no/model"}, "reward_model_name_or_path="),
        ({"reward_funcs": ["no_such_reward"]}, "reward_funcs='no_such_reward'"),
        ({"reward_funcs": ["no_module.fn"]}, "reward_funcs='no_module.fn': cannot import"),
        ({"num_iterations": 2}, "num_iterations=2"),
        ({"not_a_field": 1}, "not_a_field=1"),
        ({"max_steps": None}, "max_steps=-1"),
        ({"model_name_or_path": "HuggingFaceTB/SmolLM2-135M"}, "model_name_or_path="),
        ({"use_dora": True}, "use_dora=True"),
    ],
)
def test_what_the_sweep_cannot_honour_is_refused_in_one_line(tmp_path, fields, named):
    recipe = write_recipe(tmp_path, **fields)
    with pytest.raises(ConfigError) as refused:
        validate(resolved(recipe))
    line = str(refused.value)
    assert "\n" not in line and line.startswith(named), line


@pytest.mark.parametrize(
    ("reward", "error"),
    [
        ("user_rewards.one_too_few", "returned 3 values for 4 completions"),
        ("user_rewards.reads_text", "raised"),  # a standard-format reward on messages
    ],
)
def test_a_recipe_reward_that_cannot_score_is_refused_before_any_trial(tmp_path, reward, error):
    """The preflight's reward check calls the recipe's rewards on two real rows, in TRL's
    conversational shape: one that raises or returns too few values is refused, naming it."""
    recipe = write_recipe(tmp_path, reward_funcs=[reward, "think_format_reward"])
    cfg = resolved(recipe, "task.reward_timeout=0")  # called here: no worker process to start
    with pytest.raises(ConfigError) as refused:
        check_task_rewards(cfg.task, set())
    line = str(refused.value)
    name = reward.rsplit(".", 1)[-1]
    assert "\n" not in line and f"reward {name!r}" in line and error in line, line


def test_fields_the_sweep_owns_are_replaced_with_one_line_and_the_objective_named(tmp_path):
    recipe = write_recipe(tmp_path, output_dir="/elsewhere", report_to="wandb", seed=7)
    cfg = resolved(recipe)
    assert cfg.seed == 0  # the sweep's seeds
    lines = notes(cfg)
    assert lines[0].endswith(f"on the 'test' split of {cfg.task.dataset_name}")
    replaced = lines[1]
    for field in ("output_dir (one per trial)", "report_to", "seed"):
        assert field in replaced
    held_out = tmp_path / "held"
    held_out.mkdir()
    data = conversational_data(held_out, test_split=False)
    line = notes(resolved(write_recipe(held_out, dataset_name=str(data))))[0]
    assert "a held-out 0.1 of the 'train' split" in line and "no 'test' split" in line


def test_the_recipe_is_recorded_by_path_and_hash(tmp_path):
    recipe = write_recipe(tmp_path)
    params = recipe_params(resolved(recipe))
    assert params == {
        RECIPE_PARAM: str(recipe.resolve()),
        RECIPE_HASH_PARAM: hashlib.sha256(recipe.read_bytes()).hexdigest(),
    }
    recipe.write_text(recipe.read_text() + "beta: 0.0\n")
    assert recipe_params(resolved(recipe))[RECIPE_HASH_PARAM] != params[RECIPE_HASH_PARAM]


@pytest.mark.slow
def test_a_trl_recipe_sweeps_reruns_tuned_and_goes_back_to_trl(tmp_path, monkeypatch, capsys):
    """Two learning rates over a `trl grpo` YAML (local tiny model and dataset, a dotted-path
    reward and a built-in one, use_peft): both trials COMPLETE, each run records the recipe's
    path and hash and the values it trained with, a verdict is printed; the tuned rerun keeps
    the recipe's other settings, and the tuned recipe parses back with TRL's parser."""
    env = sweep_env(tmp_path)
    env["PYTHONPATH"] = f"{TESTS}:{env.get('PYTHONPATH', '')}"
    hub = tmp_path / "hub"
    hub.mkdir()
    refused = run_sweep(
        hub, "backend=trl", f"backend.config={write_recipe(hub, dataset_name='org/data')}",
        "lr=1e-3,1e-2", env=env,
    )  # fmt: skip
    assert refused.returncode == 1
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("error: dataset_name='org/data': not a local path;"), line
    assert not (hub / "sweeps.db").exists() and not (hub / "mlflow.db").exists()

    recipe = write_recipe(tmp_path, beta=0.02, temperature=0.9)
    done = run_sweep(
        tmp_path, "backend=trl", f"backend.config={recipe}", "lr=1e-3,1e-2", "eval_every=1",
        env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    verdict_decision(done.stdout)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    sha = hashlib.sha256(recipe.read_bytes()).hexdigest()
    lrs = set()
    study = study_in(tmp_path)
    for trial in study.trials:
        assert trial.state.name == "COMPLETE"
        params = client.get_run(trial.user_attrs[TrialAttr.MLFLOW_RUN_ID]).data.params
        assert (params[RECIPE_PARAM], params[RECIPE_HASH_PARAM]) == (str(recipe), sha)
        assert params["group_size"] == "4" and params["temperature"] == "0.9"
        assert params["backend.grpo.beta"] == "0.02" and params["loss.name"] == "dapo"
        lrs.add(float(params["lr"]))
    assert lrs == {1e-3, 1e-2}

    rerun = subprocess.run(
        [sys.executable, "-m", "trainer", f"+tuned={study.study_name}", "experiment=rerun"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    (run,) = client.search_runs([client.get_experiment_by_name("rerun").experiment_id])
    best = study.best_trial.params["lr"]
    assert float(run.data.params["lr"]) == best
    assert run.data.params["temperature"] == "0.9" and run.data.params["group_size"] == "4"
    assert run.data.params[RECIPE_HASH_PARAM] == sha

    monkeypatch.chdir(tmp_path)  # as the sweep's folder, in this process: no more start-up
    assert analysis_main(["best", "--trl-recipe", "--storage", study_uri(tmp_path)]) == 0
    (tmp_path / "tuned_grpo.yaml").write_text(capsys.readouterr().out)
    from trl import GRPOConfig, ModelConfig, TrlParser
    from trl.scripts.grpo import GRPOScriptArguments

    parser = TrlParser((GRPOScriptArguments, GRPOConfig, ModelConfig))
    script, grpo, model = parser.parse_args_and_config(
        ["--config", str(tmp_path / "tuned_grpo.yaml")]
    )
    assert grpo.learning_rate == best and grpo.temperature == 0.9 and grpo.beta == 0.02
    assert (
        model.use_peft
        and model.lora_r == 4
        and script.reward_funcs == [REWARD, "think_format_reward"]
    )
