"""The embedded model: reproducible from its seed, a standard Hugging Face directory."""

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer.base.config import TinyModelRecipe
from trainer.sampling.tiny_model import (
    PROBE_SIZE,
    SHIPPED,
    build_tiny_model,
    sampled_accuracy,
    tiny_model_dir,
)

# A quick recipe: the real one differs only in size and in how long it warms up.
QUICK = TinyModelRecipe(
    hidden_size=32, intermediate_size=64, max_warmup_steps=60, target_accuracy=1.0
)


def weights_digest(model_dir: Path) -> str:
    return hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest()


@pytest.mark.slow
def test_same_recipe_builds_the_same_weights(tmp_path):
    first = build_tiny_model(replace(QUICK, cache_dir=str(tmp_path / "a")))
    second = build_tiny_model(replace(QUICK, cache_dir=str(tmp_path / "b")))
    assert first.name == second.name  # the directory is keyed by the recipe alone
    assert weights_digest(first) == weights_digest(second)
    other_seed = build_tiny_model(replace(QUICK, seed=1, cache_dir=str(tmp_path / "a")))
    assert other_seed != first and weights_digest(other_seed) != weights_digest(first)


@pytest.mark.slow
def test_a_built_model_is_a_plain_hugging_face_directory(tmp_path):
    model_dir = build_tiny_model(replace(QUICK, cache_dir=str(tmp_path)))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer("07+45=").input_ids
    assert (
        ids[0] == tokenizer.bos_token_id
        and tokenizer.decode(ids, skip_special_tokens=True) == "07+45="
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert 10_000 < model.num_parameters() < 1_000_000
    assert build_tiny_model(replace(QUICK, cache_dir=str(tmp_path))) == model_dir  # cached


def test_the_default_recipe_is_in_the_advertised_size_range():
    from transformers import LlamaConfig, LlamaForCausalLM

    r = TinyModelRecipe()
    config = LlamaConfig(vocab_size=19, hidden_size=r.hidden_size, intermediate_size=r.intermediate_size,
                         num_hidden_layers=r.num_layers, num_attention_heads=r.num_heads, tie_word_embeddings=True)  # fmt: skip
    assert 200_000 < LlamaForCausalLM(config).num_parameters() < 1_000_000
    assert tiny_model_dir(r) != tiny_model_dir(replace(r, hidden_size=64))


def test_the_shipped_model_is_the_default_recipe_and_reaches_its_recorded_accuracy():
    """The model that ships (built by `python -m trainer.sampling.tiny_model`) is the one the
    default recipe loads, without a build, and still solves as many problems as recorded."""
    import json
    import math
    import random

    import torch

    from trainer.env.tasks import AdditionTask

    recipe = TinyModelRecipe()
    (shipped,) = SHIPPED.iterdir()
    assert build_tiny_model(recipe) == shipped == SHIPPED / tiny_model_dir(recipe).name
    info = json.loads((shipped / "recipe.json").read_text())
    assert {**info["recipe"], "cache_dir": None} == {**vars(recipe), "cache_dir": None}
    assert (shipped / "model.safetensors").stat().st_size < 2_000_000  # tiny
    model = AutoModelForCausalLM.from_pretrained(shipped)
    tokenizer = AutoTokenizer.from_pretrained(shipped)
    probe = AdditionTask(num_digits=recipe.num_digits, eval_size=200, seed=0).train_problems(
        PROBE_SIZE, random.Random(recipe.seed + 1)
    )  # the warm start's own probe
    torch.manual_seed(0)
    accuracy = sampled_accuracy(model, tokenizer, probe)
    recorded = info["sampled_accuracy"]
    assert recorded >= recipe.target_accuracy
    # Sampling noise: 3 standard errors of a proportion over the probe.
    assert abs(accuracy - recorded) < 3 * math.sqrt(recorded * (1 - recorded) / PROBE_SIZE)
