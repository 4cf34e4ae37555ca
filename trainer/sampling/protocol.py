"""How the trainer samples: the settings, the Sampler protocol and the names (what a sampler
returns, a `Rollout`, is trainer/model/rollout.py's: the policy collates it).

Two samplers implement it: `torch_sampler.TorchSampler` (KV-cached decoding on the policy's
merged copy, in this process, CPU or GPU) and `vllm_sampler.VLLMSampler` (the GPU extra). The
recorded log-prob of a token is log_softmax(logits / temperature): the tempered policy the
learner also computes, so on-policy the sampler-train KL measures only numerical mismatch.
top_p/top_k/min_p and repetition_penalty shape which tokens are drawn but not that log-prob
(as in TRL). The factory that builds them, `factory.make_sampler`, is a module of its own
above both: the implementations import this one, and the config checks read `SAMPLERS`
here without loading torch's decoding or transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from trainer.env.prompts import Prompt, PromptRenderer
from trainer.model.rollout import Rollout


@dataclass
class SamplingSettings:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int = 8
    greedy: bool = False  # argmax decoding (eval); the log-probs stay the tempered policy's

    @classmethod
    def from_config(cls, cfg) -> SamplingSettings:
        return cls(**{k: cfg[k] for k in cls.__dataclass_fields__ if k != "greedy"})


class Sampler(Protocol):
    """What the trainer samples with (beside `Task`, what it samples for)."""

    renderer: PromptRenderer  # how its prompts become token ids

    def sync_weights(self) -> None:
        """Called before sampling with new weights: an engine of its own takes them here."""

    def sample(self, prompts: list[Prompt], settings: SamplingSettings) -> list[Rollout]:
        """One completion per prompt (a string or messages, rendered by its PromptRenderer),
        with the sampler's per-token log-probs."""


SAMPLERS = ("torch", "vllm")  # sampler.name: trainer/sampling/factory.py builds each
