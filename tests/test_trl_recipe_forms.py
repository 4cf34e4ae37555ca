"""A `trl grpo` recipe in every form TRL's parser reads its fields (a YAML string or a list,
`1e-4` as YAML's string, TRL's enums and bools, dicts or their JSON text): each becomes the
value a run trains with, or is refused in one line naming the field before any trial. And the
form TRL's and PEFT's docs use, `lora_target_modules: all-linear`, sweeps with every trial
COMPLETE."""

from __future__ import annotations

import copy
import dataclasses
import functools
from pathlib import Path
from typing import Any

import pytest
from conftest import compose_conf, needs_trl, run_sweep, study_in, sweep_env
from omegaconf import DictConfig, OmegaConf
from test_trl_recipe import write_recipe

from trainer.backends import validate
from trainer.backends.trl.recipe import with_recipe
from trainer.base.errors import ConfigError

pytestmark = needs_trl

TESTS = Path(__file__).parent


def recipe_with(root: Path, line: str) -> Path:
    """The tests' small recipe (tiny model, local dataset) with one field written as `line`
    says, appended as text so YAML's own reading of the form is exercised."""
    field = line.split(":", 1)[0]
    path = write_recipe(root, **{field: None})  # None: the field left out
    path.write_text(path.read_text() + line + "\n")
    return path


@functools.cache
def _composed_for_trl() -> DictConfig:
    return compose_conf("backend=trl")


def resolved(recipe: Path):
    """The config `backend=trl backend.config=<recipe>` trains with, validated. Composed once:
    the recipe's path is a plain string that nothing in conf/ reads while composing."""
    cfg = copy.deepcopy(_composed_for_trl())
    cfg.backend.config = str(recipe)
    cfg = with_recipe(cfg, ["backend=trl", f"backend.config={recipe}"])
    validate(cfg)
    return cfg


def value(cfg, key: str) -> Any:
    """Our key's value, or (`GRPOConfig.<field>`) what TRL's trainer gets."""
    if key.startswith("GRPOConfig."):
        from trainer.backends.trl.mapping import grpo_kwargs

        cfg.output_dir = "out"  # Hydra's run folder: none here
        return grpo_kwargs(cfg, cfg.lr)[key.removeprefix("GRPOConfig.")]
    found = OmegaConf.select(cfg, key)
    return OmegaConf.to_container(found) if OmegaConf.is_config(found) else found


SAMPLE, CYCLES = {"do_sample": True}, {"num_cycles": 0.5}  # a dict, or its JSON text
# (the YAML line as a user writes it, our key, the value the run trains with)
ACCEPTED = [
    # ModelConfig
    ("lora_target_modules: all-linear", "lora_target_modules", ["all-linear"]),
    ("lora_target_modules: [all-linear]", "lora_target_modules", ["all-linear"]),
    ("lora_target_modules: [q_proj, v_proj]", "lora_target_modules", ["q_proj", "v_proj"]),
    (r"lora_target_modules: '.*\.(q_proj|v_proj)'", "lora_target_modules", ["q_proj", "v_proj"]),
    (
        r"lora_target_modules: '.*layers\.0\.self_attn\.q_proj'",
        "lora_target_modules",
        ["model.layers.0.self_attn.q_proj"],
    ),
    ("lora_target_modules: null", "lora_target_modules", ["q_proj", "v_proj"]),  # PEFT's
    ("use_peft: false", "lora_rank", 0),
    ("use_peft: 'true'", "lora_rank", 4),
    ("lora_dropout: '0.1'", "lora_dropout", 0.1),
    ("dtype: auto", "model.dtype", "float32"),  # the checkpoint's own
    ("dtype: float32", "model.dtype", "float32"),
    # GRPOConfig
    ("learning_rate: 1e-4", "lr", 1e-4),  # YAML reads it as a string; TRL's parser a float
    ("learning_rate: 1.0e-4", "lr", 1e-4),
    ("temperature: '0.9'", "temperature", 0.9),
    ("num_generations: '2'", "group_size", 2),
    ("max_steps: '4'", "max_steps", 4),
    ("scale_rewards: true", "scale_rewards", "group"),
    ("scale_rewards: false", "scale_rewards", "none"),
    ("scale_rewards: batch", "scale_rewards", "batch"),
    ("lr_scheduler_type: cosine", "lr_schedule", "cosine"),
    ("lr_scheduler_type: constant", "lr_schedule", "constant"),
    ("loss_type: dr_grpo", "loss.name", "dr_grpo"),
    ("epsilon_high: 0.28", "loss.clip_high", pytest.approx(1.28)),
    ("top_k: null", "top_k", 0),
    ("min_p: null", "min_p", 0.0),
    ("reward_weights: [1.0, 0.5]", "task.reward_weights", [1.0, 0.5]),
    ("gradient_checkpointing: false", "gradient_checkpointing", False),
    ("beta: '0.04'", "backend.grpo.beta", 0.04),
    ("generation_kwargs: {do_sample: true}", "backend.grpo.generation_kwargs", SAMPLE),
    ("generation_kwargs: '{\"do_sample\": true}'", "backend.grpo.generation_kwargs", SAMPLE),
    ("lr_scheduler_kwargs: {num_cycles: 0.5}", "backend.grpo.lr_scheduler_kwargs", CYCLES),
    ("lr_scheduler_kwargs: '{\"num_cycles\": 0.5}'", "backend.grpo.lr_scheduler_kwargs", CYCLES),
    ("log_completions: true", "backend.grpo.log_completions", True),
    ("report_to: [mlflow]", "GRPOConfig.report_to", "none"),  # owned: the sweep logs
    ("report_to: mlflow", "GRPOConfig.report_to", "none"),
    ("beta: 0.04", "GRPOConfig.beta", 0.04),
    # ScriptArguments
    ("reward_funcs: [think_format_reward]", "task.rewards.0.name", "think_format_reward"),
    ("dataset_test_split: test", "task.test_split", "test"),
]


@pytest.mark.parametrize(("line", "key", "expected"), ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_each_documented_form_becomes_the_value_the_run_trains_with(tmp_path, line, key, expected):
    assert value(resolved(recipe_with(tmp_path, line)), key) == expected


# (the YAML line, the start of its one-line refusal: the field and its value)
REFUSED = [
    ("lora_target_modules: q_proj", "lora_target_modules='q_proj': one name is a regex"),
    ("lora_target_modules: [q_proj]", "lora_target_modules='q_proj': one name is a regex"),
    ("lora_target_modules: '(q_proj'", "lora_target_modules='(q_proj': not a regex"),
    ("lora_target_parameters: [mlp.experts.down_proj]", "lora_target_parameters="),
    ("use_dora: true", "use_dora=True"),
    ("load_in_4bit: true", "load_in_4bit=True"),
    ("dtype: bfloat16", "model.dtype='bfloat16': backend=trl trains float32 weights"),
    ("reward_funcs: think_format_reward", "reward_funcs='think_format_reward': must be a list"),
    ("num_iterations: 2", "num_iterations=2"),
    ("loss_type: cispo", "loss.name='cispo'"),
    ("scale_rewards: 'yes'", "scale_rewards='yes'"),
    ("generation_kwargs: {temperature: 0.5}", "backend.grpo.generation_kwargs.temperature=0.5"),
    ("dataset_streaming: true", "dataset_streaming=True"),
    ("max_steps: -1", "max_steps=-1"),
    ("lr_scheduler_type: cosin", "lr_scheduler_type='cosin': TRL refuses it: cosin is not a valid"),
    ("debug: ''", "debug='': TRL refuses it: invalid DebugOption value"),
]


@pytest.mark.parametrize(("line", "named"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_form_the_sweep_cannot_honour_is_refused_in_one_line(tmp_path, line, named):
    with pytest.raises(ConfigError) as refused:
        resolved(recipe_with(tmp_path, line))
    message = str(refused.value)
    assert "\n" not in message and message.startswith(named), message


@pytest.mark.slow
def test_an_all_linear_recipe_sweeps_with_every_trial_complete(tmp_path):
    """The recipe as TRL's docs write it (`lora_target_modules: all-linear`), swept over two
    learning rates through the real CLI: both trials COMPLETE, each trained with every linear
    layer adapted (the MLflow param)."""
    env = sweep_env(tmp_path)
    env["PYTHONPATH"] = f"{TESTS}:{env.get('PYTHONPATH', '')}"
    recipe = recipe_with(tmp_path, "lora_target_modules: all-linear")
    done = run_sweep(
        tmp_path, "backend=trl", f"backend.config={recipe}", "lr=1e-4,1e-3", "eval_every=2",
        env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    study = study_in(tmp_path)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    from mlflow.tracking import MlflowClient

    from records.sweep import TrialAttr

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    for trial in study.trials:
        params = client.get_run(trial.user_attrs[TrialAttr.MLFLOW_RUN_ID]).data.params
        assert params["lora_target_modules"] == "['all-linear']"


def written_default(field) -> str:
    """A dataclass field's default as a YAML line, as a user copies it from TRL's docs."""
    import enum

    import yaml

    default = field.default
    if default is dataclasses.MISSING:
        factory = field.default_factory
        default = None if factory is dataclasses.MISSING else factory()
    if isinstance(default, enum.Enum):
        default = default.value
    return yaml.safe_dump({field.name: default}, default_flow_style=True).strip()[1:-1]


@pytest.mark.slow
def test_every_field_of_trls_three_dataclasses_resolves_or_is_refused_in_one_line(tmp_path):
    """Each GRPOConfig (TrainingArguments' fields included), ModelConfig and
    GRPOScriptArguments field, written with its default: the recipe resolves and passes the
    checks, or is refused by a one-line ConfigError; never another error (2 min here)."""
    from trl import GRPOConfig, ModelConfig
    from trl.scripts.grpo import GRPOScriptArguments

    given = {"model_name_or_path", "dataset_name", "output_dir"}  # the recipe's own paths
    refused, checked = {}, 0
    for cls in (GRPOConfig, ModelConfig, GRPOScriptArguments):
        for field in dataclasses.fields(cls):
            if not field.init or field.name in given:
                continue
            root = tmp_path / f"{cls.__name__}-{field.name}"
            root.mkdir()
            checked += 1
            try:
                resolved(recipe_with(root, written_default(field)))
            except ConfigError as e:
                assert "\n" not in str(e), str(e)
                refused[field.name] = str(e)
    assert checked > 200
    # TRL's own defaults a sweep cannot take as written: epochs, no reward, debug's ''
    assert set(refused) == {"max_steps", "reward_funcs", "debug"}, refused
