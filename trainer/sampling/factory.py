"""Builds the sampler that `sampler.name` names (trainer/sampling/protocol.py has the protocol)."""

from __future__ import annotations

from trainer.env.prompts import PromptRenderer, prompt_settings
from trainer.sampling.protocol import SAMPLERS, Sampler
from trainer.sampling.torch_sampler import TorchSampler


def make_sampler(name: str, policy, cfg) -> Sampler:
    renderer = PromptRenderer(policy.tokenizer, **prompt_settings(cfg.task))
    if name == "torch":
        return TorchSampler(policy, cfg.sampler.batch_tokens, renderer)
    if name == "vllm":
        from trainer.sampling.vllm_sampler import (
            VLLMSampler,  # GPU extra: imported only when asked for
        )

        return VLLMSampler(policy, cfg, renderer)
    # Validation refuses an unknown name before anything loads; this only guards the factory.
    raise ValueError(f"sampler.name={name!r}: must be one of {SAMPLERS}")
