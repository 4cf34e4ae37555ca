"""Prompts in a KV cache, for the sampler's decoding and the learner's forward alike.

`prefill_shared` runs each distinct prompt once and shares its keys and values with the rows
that continue it; `make_room` then lets decoding append to the cache in place, and
`prompt_cache` lets the learner's completions read it without writing it. Its own module,
below both users: the learner's passes (trainer/model/fast_logprobs.py) take it without
importing a sampler.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def with_cache(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """The forward keyword that hands `model` a KV cache: `cache` where transformers renamed
    it (5.x warns on every call with the old name, which 5.40 removes), else
    `past_key_values`. A PEFT model passes keywords through to its base model, whose name
    counts."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {_cache_keyword(type(base)): cache}


@functools.cache
def _cache_keyword(model_class: type) -> str:
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def prefill_shared(
    model: torch.nn.Module,
    prompt_ids_DS: torch.Tensor,
    prompt_mask_DS: torch.Tensor,
    prompt_of_N: torch.Tensor,
) -> tuple[torch.Tensor, DynamicCache, torch.Tensor, bool]:
    """Each distinct left-padded prompt run once, its keys and values then indexed out to the N
    rows that continue it (an index, so gradients flow back through it in the learner).

    Returns the logits that predict each row's first token, the expanded cache, each row's last
    prompt position, and whether any prompt is padded: only then do the later calls need a mask
    (without one, transformers builds none and takes its causal fast path).
    """
    padded = not bool(prompt_mask_DS.all())
    positions_DS = (prompt_mask_DS.cumsum(-1) - 1).clamp(min=0)
    # Not transformers' StaticCache, slower here (bench/BENCHMARKS.md, "What changed"): it
    # attends over its whole length under a mask. make_room's buffers do not.
    cache = DynamicCache(config=model.config)
    logits_DV = model(
        input_ids=prompt_ids_DS,
        attention_mask=prompt_mask_DS if padded else None,
        position_ids=positions_DS,
        **with_cache(model, cache),
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]
    cache.batch_select_indices(prompt_of_N)
    return logits_DV[prompt_of_N], cache, positions_DS[prompt_of_N, -1:], padded


class PreallocatedLayer(DynamicLayer):
    """A layer's keys and values in a buffer with room for `room` more positions, written in
    place. DynamicLayer appends with torch.cat, which copies the whole cache at every token:
    quadratic in the completion's length (a 256-token completion copies the cache 256 times).
    The layer hands out views of the filled part, the same values the cat would give."""

    def __init__(self, layer: DynamicLayer, room: int) -> None:
        super().__init__()
        keys, values = layer.keys, layer.values
        rows, heads, length, width = keys.shape
        self.key_buffer = keys.new_empty(rows, heads, length + room, width)
        self.value_buffer = values.new_empty(rows, heads, length + room, values.shape[-1])
        self.key_buffer[:, :, :length] = keys
        self.value_buffer[:, :, :length] = values
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self._fill(length)

    def update(self, key_states, value_states, *args, **kwargs):
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self.key_buffer.shape[-2]:
            raise RuntimeError(f"the cache holds {self.key_buffer.shape[-2]} positions, not {end}")
        self.key_buffer[:, :, start:end] = key_states
        self.value_buffer[:, :, start:end] = value_states
        self._fill(end)
        return self.keys, self.values

    def _refuse(self, *args, **kwargs) -> None:
        raise NotImplementedError("a preallocated cache only appends (make_room is for decoding)")

    # DynamicLayer's reshaping would replace the views and leave the buffers behind.
    crop = batch_select_indices = batch_repeat_interleave = reorder_cache = _refuse

    def _fill(self, length: int) -> None:
        self.length = length
        self.keys = self.key_buffer[:, :, :length]
        self.values = self.value_buffer[:, :, :length]


def make_room(cache: DynamicCache, room: int) -> None:
    """Decoding from here appends up to `room` positions in place (PreallocatedLayer); layers of
    other kinds (a sliding window's) keep their own update."""
    cache.layers = [
        PreallocatedLayer(layer, room)
        if type(layer) is DynamicLayer and layer.is_initialized
        else layer
        for layer in cache.layers
    ]


class PromptCache(DynamicCache):
    """The shared prompts' keys and values, read and never extended: each layer attends over
    them and the completions' own. A DynamicCache would append the completions' keys, twice
    when a checkpointed layer runs again in the backward."""

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        layer = self.layers[layer_idx]
        return torch.cat([layer.keys, key_states], -2), torch.cat([layer.values, value_states], -2)


def prompt_cache(cache: DynamicCache) -> PromptCache:
    read_only = PromptCache()
    read_only.layers = cache.layers
    return read_only
