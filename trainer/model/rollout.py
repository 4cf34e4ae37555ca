"""A rollout: one sampled completion with the sampler's per-token log-probs.

What every sampler returns (trainer/sampling/protocol.py: `Sampler.sample`) and what `collate`
turns into the policy's token tensors (trainer/model/token_batch.py); here, below both, so the
policy does not import the samplers' layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Rollout:
    prompt_ids: list[int]  # the prompt as rendered once (trainer/env/prompts.py); the learner's too
    completion_ids: list[int]  # includes the end-of-sequence token when one was sampled
    sampler_logps: list[float]  # one per completion token
    finished: bool  # ended with one of eos_ids' tokens (False: truncated at max_tokens)
    text: str  # the completion decoded, without special tokens
    # Each reward's score by name, logged per name; set by `score` (trainer/env/rewards.py).
    reward_parts: dict[str, float] = field(default_factory=dict)


def eos_ids(model, tokenizer) -> frozenset[int]:
    """What ends a completion: the model's generation config's end-of-sequence ids (an int or
    a list: chat models end a turn on several) and the tokenizer's, as transformers' and TRL's
    generation stop."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = set(configured if isinstance(configured, list | tuple) else [configured])
    return frozenset(i for i in ids | {tokenizer.eos_token_id} if i is not None)
