"""What a packed member's own train() (trainer/run/train.py) sees: its policy, whose log-prob
passes are the pack's, and its sampler, which samples in the pack's decode.

A member is a trial that runs the ordinary train() in a thread of its own, with a
`MemberSource` for its policy and sampler. Every call that runs the model (sampling, the
reference and post-update log-probs, the learner's forward and backward) becomes a request to
the host (trainer/packed/host.py), which runs the same request of every member as one batch.
Everything else (the data order, rewards, advantages, losses, the optimizer, the health rules,
the evals, checkpoints) is the member's own, exactly the solo code.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import astuple, dataclass
from typing import Any, Protocol

import torch
from omegaconf import DictConfig

from trainer.env.prompts import Prompt, PromptRenderer, prompt_settings
from trainer.model.policy import Policy
from trainer.model.rollout import Rollout
from trainer.model.token_batch import TokenBatch
from trainer.sampling.model_source import load_policy
from trainer.sampling.protocol import SamplingSettings


class Member(Protocol):
    """A member as its policy and sampler see it (trainer/packed/host.py's `Member`)."""

    host: Any  # its PackHost: attach(member, peft_model, tokenizer)

    def call(self, key: tuple, payload: Any) -> Any:
        """The host's batched answer to a request of this kind."""


@dataclass
class MemberPolicy(Policy):
    """The member's PEFT model (its adapter; the base weights are the host's), with the
    log-prob passes run by the host on the whole pack."""

    member: Member | None = None

    def logprobs(self, batch: TokenBatch, temperature: float, role: str) -> torch.Tensor:
        """In the solo run's micro-batches (each a request), so that each piece's rows are laid
        out as alone: a group split across pieces packs its prompt otherwise."""
        key, split = ("logprobs", role, temperature), getattr(self.passes, "micro_batches", None)
        if split is None:
            return self.member.call(key, batch)
        rows = torch.arange(len(batch.prompt_of_N), device=batch.prompt_of_N.device)
        return torch.cat([self.member.call(key, batch.select(p)) for p in split(batch, rows)])

    def learner_pieces(
        self, batch: TokenBatch, rows: torch.Tensor, temperature: float
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Each micro-batch of the rollouts, as the solo run cuts them, through the pack's
        learner forward, handed over as a leaf: the loss's backward stops there, and its
        gradient goes back into the pack's backward of that piece before the next piece is
        asked for, so its activations go then. The host runs together only the members' pieces
        that fit one piece's budget (batches.py, `learner_round`)."""
        split = getattr(self.passes, "micro_batches", None)
        budget = getattr(self.passes, "learner_batch_tokens", None)
        for rows_of_piece in split(batch, rows) if split else [rows]:
            call = (batch, rows_of_piece, budget)
            forward, [(piece, logp_NT, entropy_NT)] = self.member.call(
                ("learner", temperature), call
            )
            leaf = logp_NT.requires_grad_()
            yield piece, leaf, entropy_NT
            grad = torch.zeros_like(leaf) if leaf.grad is None else leaf.grad
            self.member.call(("backward",), (forward, [grad]))


class MemberSampler:
    """Samples in the pack's decode, with the member's prompts rendered as its solo sampler
    renders them (trainer/sampling/factory.py)."""

    def __init__(self, member: Member, policy: Policy, cfg: DictConfig) -> None:
        self.member = member
        self.renderer = PromptRenderer(policy.tokenizer, **prompt_settings(cfg.task))
        self.batch_tokens = cfg.sampler.batch_tokens

    def sync_weights(self) -> None:
        """Nothing to do: the pack's adapters are the members' own parameters."""

    def sample(self, prompts: list[Prompt], settings: SamplingSettings) -> list[Rollout]:
        ids_N = [tuple(ids) for ids in self.renderer.render_all(prompts)]
        return self.member.call(("sample", astuple(settings)), (ids_N, self.batch_tokens, settings))


class MemberSource:
    """train()'s PolicySource for a member: the solo load (so its LoRA init draws what it would
    alone), its adapter then attached to the host's base model."""

    def __init__(self, member: Member) -> None:
        self.member = member

    def policy(self, cfg: DictConfig) -> Policy:
        policy = load_policy(cfg)
        self.member.host.attach(self.member, policy.model, policy.tokenizer)
        return MemberPolicy(
            policy.model,
            policy.tokenizer,
            policy.device,
            merge_lora=False,
            passes=policy.passes,
            member=self.member,
        )

    def sampler(self, policy: Policy, cfg: DictConfig) -> MemberSampler:
        return MemberSampler(self.member, policy, cfg)


_serving = threading.local()  # the member a thread of the pack runs (host.py's Member.main)


def serve_as(member: Member) -> None:
    """This thread runs `member`: the train() it calls trains as that member."""
    _serving.member = member


def current_source() -> MemberSource | None:
    """The policy source of the member this thread runs, or None outside a pack: how a sweep
    job's ordinary code (sweeper/sweep/job.py, by way of trainer.backends.train) trains as a
    member without being told."""
    member = getattr(_serving, "member", None)
    return MemberSource(member) if member is not None else None
