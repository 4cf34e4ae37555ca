"""Bad settings fail before any model loads, naming the parameter, the value and the rule."""

import json

import pytest
from conftest import compose_conf

from trainer.run.validation import ConfigError, validate


def test_defaults_are_valid():
    assert validate(compose_conf()) == []


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("temperature=0", "temperature=0.0: must be in (0, 10)"),
        ("temperature=10.0", "temperature=10.0: must be in (0, 10)"),
        ("lr=0", "lr=0: must be > 0"),
        ("lr=-1e-5", "lr=-1e-05: must be > 0"),
        ("lr=fast", "lr='fast': must be a number or \"auto\""),
        ("num_substeps=3", "num_substeps=3: batch_size=32 must be divisible by num_substeps"),
        ("group_size=1", "group_size=1: must be >= 2"),
        ("kl_penalty_coef=-0.1", "kl_penalty_coef=-0.1: must be >= 0"),
        ("loss.name=reinforce", "loss.name='reinforce': must be one of"),
        ("scale_rewards=std", "scale_rewards='std': must be one of"),
        ("top_p=0", "top_p=0.0: must be in (0, 1]"),
        ("max_tokens=0", "max_tokens=0: must be >= 1"),
        ("lr_schedule=step", "lr_schedule='step': must be one of"),
        ("lr=auto model.family=gpt", "model.family='gpt': lr=auto needs a calibrated family"),
        ("model.path=/no/such/model", "model.path='/no/such/model': must be a Hugging Face model"),
        ("task=jsonl", None),  # task.path is required: Hydra's own MissingMandatoryValue
    ],
)
def test_bad_settings_name_parameter_value_and_rule(override, message):
    if message is None:
        with pytest.raises(Exception, match="task.path"):
            validate(compose_conf(override, "task.path=???"))
        return
    with pytest.raises(ConfigError) as error:
        validate(compose_conf(*override.split()))
    assert message in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("overrides", "warning"),
    [
        (["lr=2.0"], "lr=2.0 is outside [1e-7, 1]"),
        (["lr=1e-9"], "lr=1e-09 is outside [1e-7, 1]"),
        (["loss=dapo", "loss.clip_high=1.2"], "loss.clip_high=1.2: DAPO recommends 1.28"),
        (["loss=dapo", "loss.mask_truncated_completions=false"], "DAPO recommends True"),
        (["loss=dapo", "kl_penalty_coef=0.05"], "kl_penalty_coef=0.05: DAPO recommends 0"),
    ],
)
def test_suspicious_settings_warn(overrides, warning):
    warnings = validate(compose_conf(*overrides))
    assert any(warning in w for w in warnings), warnings


def test_dapo_defaults_follow_the_recommendation():
    assert validate(compose_conf("loss=dapo")) == []


def test_misspelt_key_fails_at_composition():
    with pytest.raises(Exception, match="group_sise"):
        compose_conf("group_sise=8")


def test_jsonl_rows_are_checked_with_line_numbers(tmp_path):
    data = tmp_path / "tasks.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n{broken\n")
    with pytest.raises(ConfigError, match="line 2 is not JSON"):
        validate(compose_conf("task=jsonl", f"task.path={data}"))
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(ConfigError, match="task.path=.*no such file"):
        validate(compose_conf("task=jsonl", f"task.path={missing}"))
