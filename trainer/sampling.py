"""Batched sampling that records the sampler's per-token log-probs.

`TorchSampler` wraps transformers' `generate` (KV cache, stops at end-of-sequence) and
works on CPU and GPU. The recorded log-prob of a token is log_softmax(logits / temperature):
the tempered policy the learner also computes, so on-policy the sampler-train KL measures only
numerical mismatch. top_p/top_k/min_p/repetition_penalty shape which tokens are drawn but not
that log-prob (as in TRL). `vllm_sampler` is imported only when `sampler=vllm` asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase


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


@dataclass
class Rollout:
    prompt_ids: list[int]
    completion_ids: list[int]  # includes the end-of-sequence token when one was sampled
    sampler_logps: list[float]  # one per completion token
    finished: bool  # ended with end-of-sequence (False: truncated at max_tokens)
    text: str  # the completion decoded, without special tokens


class Sampler(Protocol):
    """What the trainer samples with (beside `Task`, what it samples for)."""

    def sync_weights(self) -> None:
        """Called before sampling with new weights: an engine of its own takes them here."""

    def sample(self, prompts: list[str], settings: SamplingSettings) -> list[Rollout]:
        """One completion per prompt, with the sampler's per-token log-probs."""


SAMPLERS = ("torch", "vllm")  # sampler.name: make_sampler builds each


def generation_config(s: SamplingSettings, tokenizer: PreTrainedTokenizerBase) -> GenerationConfig:
    return GenerationConfig(
        do_sample=not s.greedy,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k or None,
        min_p=s.min_p or None,
        repetition_penalty=s.repetition_penalty,
        max_new_tokens=s.max_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        return_dict_in_generate=True,
        output_logits=True,
    )


class TorchSampler:
    def __init__(self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, device) -> None:
        self.model, self.tokenizer, self.device = model, tokenizer, device

    def sync_weights(self) -> None:
        """Nothing to do: generate() reads the live weights."""

    @torch.no_grad()
    def sample(
        self, prompts: list[str], settings: SamplingSettings, chunk_size: int = 512
    ) -> list[Rollout]:
        rollouts: list[Rollout] = []
        for start in range(0, len(prompts), chunk_size):
            rollouts += self._sample_chunk(prompts[start : start + chunk_size], settings)
        return rollouts

    def _sample_chunk(self, prompts: list[str], settings: SamplingSettings) -> list[Rollout]:
        tok = self.tokenizer
        tok.padding_side = "left"  # generation appends on the right
        enc = tok(prompts, return_tensors="pt", padding=True).to(self.device)
        was_training = self.model.training
        self.model.eval()
        out = self.model.generate(**enc, generation_config=generation_config(settings, tok))
        self.model.train(was_training)
        new_tokens_NT = out.sequences[:, enc.input_ids.shape[1] :].cpu()
        logits_NTV = torch.stack(out.logits, dim=1).float().cpu() / settings.temperature
        logp_NT = torch.log_softmax(logits_NTV, dim=-1).gather(-1, new_tokens_NT[..., None])[..., 0]
        rollouts = []
        for i in range(len(prompts)):
            prompt_ids = enc.input_ids[i][enc.attention_mask[i].bool()].tolist()
            tokens = new_tokens_NT[i].tolist()
            finished = tok.eos_token_id in tokens
            length = tokens.index(tok.eos_token_id) + 1 if finished else len(tokens)
            completion = tokens[:length]
            rollouts.append(
                Rollout(
                    prompt_ids=prompt_ids,
                    completion_ids=completion,
                    sampler_logps=logp_NT[i, :length].tolist(),
                    finished=finished,
                    text=tok.decode(completion, skip_special_tokens=True),
                )
            )
        return rollouts


def make_sampler(name: str, policy, cfg) -> Sampler:
    if name == "vllm":
        from trainer.vllm_sampler import VLLMSampler  # GPU extra: imported only when asked for

        return VLLMSampler(policy, cfg)
    return TorchSampler(policy.model, policy.tokenizer, policy.device)
