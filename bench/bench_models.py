"""The checkpoints the benchmarks run on: the project's tiny model, and a wider, deeper random
Llama (hidden 512, 4 layers) for the workload where generation dominates."""

from __future__ import annotations

import os
from pathlib import Path


def model_dir(kind: str) -> Path:
    if kind == "tiny":
        from hydra import compose, initialize_config_dir

        from trainer.base.config import config_dir
        from trainer.sampling.tiny_model import build_tiny_model

        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            return build_tiny_model(compose("config").model.tiny)
    return build_large_model()


def build_large_model(hidden: int = 512, layers: int = 4) -> Path:
    """A random Llama of the tiny model's tokenizer, wider and deeper; end-of-sequence rare."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.sampling.tiny_model import build_tokenizer

    target = Path(os.path.expanduser("~/.cache/grpo-sweeper")) / f"bench-llama-{hidden}x{layers}"
    if (target / "config.json").exists():
        return target
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # logits spread ~ N(0, 4.5): sampling has entropy, EOS (logit 0) is rare
        model.lm_head.weight.normal_(0.0, 0.2)
        model.lm_head.weight[tokenizer.eos_token_id] = 0.0
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target
