"""Prompts in a KV cache, for the sampler's decoding and the learner's forward alike.

`prefill_shared` runs each distinct prompt once and shares its keys and values with the rows
that continue it. Its own module, below both users: the policy (trainer/model/policy.py) takes it
without importing a sampler.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows as a left-padded tensor and its attention mask (generation appends right).
    One tensor built from padded lists, not a copy per row."""
    width = max(map(len, rows))
    ids = [[pad_id] * (width - len(row)) + list(row) for row in rows]
    mask = [[0] * (width - len(row)) + [1] * len(row) for row in rows]
    return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)


def prefill_shared(
    model: torch.nn.Module,
    prompt_ids_DP: torch.Tensor,
    prompt_mask_DP: torch.Tensor,
    prompt_of_N: torch.Tensor,
) -> tuple[torch.Tensor, DynamicCache, torch.Tensor, bool]:
    """Each distinct left-padded prompt run once, its keys and values then indexed out to the N
    rows that continue it (an index, so gradients flow back through it in the learner).

    Returns the logits that predict each row's first token, the expanded cache, each row's last
    prompt position, and whether any prompt is padded: only then do the later calls need a mask
    (without one, transformers builds none and takes its causal fast path).
    """
    padded = not bool(prompt_mask_DP.all())
    positions_DP = (prompt_mask_DP.cumsum(-1) - 1).clamp(min=0)
    # A growing cache: transformers' preallocated StaticCache measured slower here, on the
    # tiny model and at 64 tokens on a 512-wide one.
    cache = DynamicCache(config=model.config)
    logits_DV = model(
        input_ids=prompt_ids_DP,
        attention_mask=prompt_mask_DP if padded else None,
        position_ids=positions_DP,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]
    cache.batch_select_indices(prompt_of_N)
    return logits_DV[prompt_of_N], cache, positions_DP[prompt_of_N, -1:], padded
