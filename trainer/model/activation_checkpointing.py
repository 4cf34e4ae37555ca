"""Activation checkpointing for the learner (`gradient_checkpointing=true`): on for every
decoder layer when the model loads, off for the shared prompts' prefill, which writes a cache.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from transformers.modeling_layers import GradientCheckpointingLayer


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Activation checkpointing through transformers: each decoder layer keeps only its input
    for the backward and runs again there. Non-reentrant torch.utils.checkpoint, under which
    the merged copy's custom backward works as it is. A checkpointed layer may keep the
    learner's prompt cache (transformers drops any other), since a PromptCache
    (trainer/model/kv_cache.py) is never written: the layer run again reads the same keys and
    values."""
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    for module in model.modules():
        if isinstance(module, GradientCheckpointingLayer):
            module._can_checkpoint_with_cache = True


@contextlib.contextmanager
def prefill_unchecked(model: torch.nn.Module) -> Iterator[None]:
    """Checkpointing off for the shared prompts' prefill: it writes its cache, which a layer run
    again in the backward would write twice. Its activations are the prompts', once each."""
    layers = [
        m
        for m in model.modules()
        if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing
    ]
    for layer in layers:
        layer.gradient_checkpointing = False
    try:
        yield
    finally:
        for layer in layers:
            layer.gradient_checkpointing = True
