"""Build the embedded default model: no model hub; the default recipe's model ships built.

A Llama-style transformers model with a character-level tokenizer (built with `tokenizers`,
wrapped as PreTrainedTokenizerFast), warm-started by supervised training on integer addition
until its *sampled* accuracy reaches `target_accuracy`, so the base policy solves some
problems but not all and RL has signal to work with. Saved in Hugging Face format under a
directory keyed by the recipe, so later runs (and other sweep workers) load it instead.

The default recipe's model ships in the package (SHIPPED, about 1.3 MB), built at release time
by `python -m trainer.sampling.tiny_model`: a first sweep starts at once instead of waiting a
minute or more for the warm start. Built bytes differ across CPUs, so the shipped copy is the
one everybody loads; tests/test_tiny_model.py checks it matches its recipe and accuracy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
from dataclasses import asdict, is_dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from trainer.base.progress import progress
from trainer.env.tasks import AdditionTask, exact_match_reward
from trainer.model.policy import Policy
from trainer.sampling.protocol import SamplingSettings
from trainer.sampling.torch_sampler import TorchSampler

log = logging.getLogger(__name__)

RECIPE_VERSION = 3  # bump when the build procedure changes, so old caches are not reused
SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>"]
CHARACTERS = list("0123456789+-=*/ ")
PROBE_SIZE = 256  # problems sampled to measure the warm start's accuracy
PROBE_EVERY = 50  # supervised steps between accuracy probes
SHIPPED = Path(__file__).parent / "tiny_weights"  # built models packaged with the code


def _recipe_dict(recipe) -> dict:
    if isinstance(recipe, DictConfig):
        return OmegaConf.to_container(recipe, resolve=True)
    return asdict(recipe) if is_dataclass(recipe) else dict(recipe)


def tiny_model_dir(recipe) -> Path:
    fields = _recipe_dict(recipe)
    cache_dir = Path(os.path.expanduser(fields.pop("cache_dir")))
    key = json.dumps({"version": RECIPE_VERSION, **fields}, sort_keys=True)
    return cache_dir / f"tiny-addition-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")  # one char a token
    tokenizer.decoder = decoders.Fuse()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<pad>",
    )


def build_model(recipe: dict, tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=recipe["hidden_size"],
        intermediate_size=recipe["intermediate_size"],
        num_hidden_layers=recipe["num_layers"],
        num_attention_heads=recipe["num_heads"],
        num_key_value_heads=recipe["num_heads"],
        max_position_embeddings=64,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def supervised_batch(problems, tokenizer) -> dict[str, torch.Tensor]:
    """Prompt + answer + <eos>; the loss covers only the answer and <eos>."""
    tokenizer.padding_side = "right"
    texts = [p.prompt + p.answer for p in problems]
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    eos = torch.full((len(texts), 1), tokenizer.pad_token_id)
    input_ids = torch.cat([enc.input_ids, eos], dim=1)
    lengths = enc.attention_mask.sum(dim=1)
    input_ids[torch.arange(len(texts)), lengths] = tokenizer.eos_token_id
    labels = torch.full_like(input_ids, -100)
    for i, p in enumerate(problems):
        start = len(tokenizer(p.prompt).input_ids)
        labels[i, start : lengths[i] + 1] = input_ids[i, start : lengths[i] + 1]
    attention_mask = (labels != -100) | (torch.arange(input_ids.shape[1]) < lengths[:, None])
    return {"input_ids": input_ids, "attention_mask": attention_mask.long(), "labels": labels}


def sampled_accuracy(model, tokenizer, problems) -> float:
    sampler = TorchSampler(Policy(model, tokenizer, torch.device("cpu")))
    with torch.random.fork_rng():  # probing never changes the training's random stream
        rollouts = sampler.sample([p.prompt for p in problems], SamplingSettings(max_tokens=6))
    rewards = [
        exact_match_reward(p.answer, r.text, r.finished)
        for p, r in zip(problems, rollouts, strict=True)
    ]
    return sum(rewards) / len(problems)


def warm_start(model, tokenizer, recipe: dict) -> float:
    """Supervised steps until sampled accuracy on training problems reaches the target."""
    task = AdditionTask(num_digits=recipe["num_digits"], eval_size=200, seed=0)
    rng = random.Random(recipe["seed"])
    probe = task.train_problems(PROBE_SIZE, random.Random(recipe["seed"] + 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe["warmup_lr"])
    # A short linear warmup: at full lr from step 1 the model stalls on the easy digits.
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 50))
    accuracy = 0.0
    bar = progress(range(1, recipe["max_warmup_steps"] + 1), "building tiny model", leave=False)
    for step in bar:
        batch = supervised_batch(task.train_problems(recipe["warmup_batch_size"], rng), tokenizer)
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        schedule.step()
        if step % PROBE_EVERY == 0:
            accuracy = sampled_accuracy(model, tokenizer, probe)
            bar.set_postfix(loss=f"{loss.item():.3f}", sampled_acc=f"{accuracy:.2f}")
            if accuracy >= recipe["target_accuracy"]:
                break
    bar.close()
    if accuracy < recipe["target_accuracy"]:
        log.warning(
            "Warm start reached sampled accuracy %.2f < target %.2f",
            accuracy,
            recipe["target_accuracy"],
        )
    return accuracy


def build_tiny_model(recipe) -> Path:
    """Return the model directory, building and caching it on first use."""
    target = tiny_model_dir(recipe)
    for ready in (SHIPPED / target.name, target):  # the shipped bytes first: the same for all
        if (ready / "recipe.json").exists():
            return ready
    fields = _recipe_dict(recipe)
    log.info("Building the embedded tiny model (cached at %s)", target)
    torch.manual_seed(fields["seed"])
    tokenizer = build_tokenizer()
    model = build_model(fields, tokenizer)
    accuracy = warm_start(model, tokenizer, fields)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    info = {"recipe": fields, "version": RECIPE_VERSION, "sampled_accuracy": accuracy}
    (staging / "recipe.json").write_text(json.dumps(info, indent=2))
    try:  # atomic: concurrent builders (sweep workers) race harmlessly
        staging.rename(target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("Tiny model ready: sampled accuracy %.2f after warm start", accuracy)
    return target


def ship() -> Path:
    """Build the default recipe's model (or take it from the cache) into SHIPPED."""
    from trainer.base.config import TinyModelRecipe

    built = build_tiny_model(TinyModelRecipe())
    target = SHIPPED / built.name
    if built != target:
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(built, target)
    for old in SHIPPED.iterdir():  # one shipped model: the current recipe's
        if old != target:
            shutil.rmtree(old)
    return target


if __name__ == "__main__":
    print(ship())
