"""Policy-gradient losses, chosen by name from a registry (`loss=ppo` on the command line).

Each loss is a per-token objective (plain importance sampling, or the PPO-clipped ratio)
and an aggregation over tokens and sequences. The aggregations are the ones users know from
other trainers; they differ only in how long and short completions are weighted.

Where a loss's parts live (each value once):
  - here: the objective and the aggregation, nothing else;
  - LossConfig (trainer/base/config.py): the settings' defaults, the clip bounds 0.8/1.2 included;
  - conf/loss/<name>.yaml: what a loss sets apart from those defaults. dapo is bnpo's
    function; DAPO's own values (clip-higher, truncated completions masked) are its preset's,
    which trainer/run/validation.py reads to warn when a run changes them;
  - the step (trainer/rl/step.py): loss.mask_truncated_completions, for any loss that sets it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from trainer.base.config import LossConfig


@dataclass(frozen=True)
class LossInputs:
    logp_NT: torch.Tensor  # learner log-probs of the sampled tokens (with grad)
    sampler_logp_NT: torch.Tensor  # the sampler's log-probs of the same tokens
    advantages_NT: torch.Tensor  # per-token advantages (after any KL shaping)
    mask_NT: torch.Tensor  # 1 on action tokens that get gradient, else 0
    max_tokens: int  # completion length limit, for dr_grpo's constant normaliser
    # The minibatch's sequences and action tokens, which normalise the aggregations. A learner
    # micro-batch (a piece of the minibatch) passes the whole minibatch's, so that the pieces'
    # losses and gradients sum to the minibatch's exactly; None: this input's own.
    minibatch_sequences: int | None = None
    minibatch_tokens: torch.Tensor | None = None

    @property
    def num_sequences(self) -> int:
        return (
            self.mask_NT.shape[0] if self.minibatch_sequences is None else self.minibatch_sequences
        )

    @property
    def num_tokens(self) -> torch.Tensor:
        tokens = self.mask_NT.sum() if self.minibatch_tokens is None else self.minibatch_tokens
        return tokens.clamp(min=1)


LossFn = Callable[[LossInputs, LossConfig], torch.Tensor]
LOSSES: dict[str, LossFn] = {}


def register(name: str) -> Callable[[LossFn], LossFn]:
    def add(fn: LossFn) -> LossFn:
        LOSSES[name] = fn
        return fn

    return add


def get_loss(name: str) -> LossFn:
    if name not in LOSSES:
        raise KeyError(f"loss.name={name!r} is unknown: choose one of {sorted(LOSSES)}")
    return LOSSES[name]


# --- per-token objectives (to be maximised; the losses negate them) ---


def importance_weighted(x: LossInputs) -> torch.Tensor:
    ratio_NT = torch.exp(x.logp_NT - x.sampler_logp_NT)
    return ratio_NT * x.advantages_NT


def clipped(x: LossInputs, cfg: LossConfig) -> torch.Tensor:
    ratio_NT = torch.exp(x.logp_NT - x.sampler_logp_NT)
    clipped_NT = torch.clamp(ratio_NT, cfg.clip_low, cfg.clip_high)
    return torch.minimum(ratio_NT * x.advantages_NT, clipped_NT * x.advantages_NT)


# --- aggregations over tokens and sequences ---


def sequence_sum_mean(obj_NT: torch.Tensor, x: LossInputs) -> torch.Tensor:
    """Sum over each sequence's tokens, mean over the minibatch's sequences."""
    return (obj_NT * x.mask_NT).sum(dim=1).sum() / x.num_sequences


def sequence_mean_mean(obj_NT: torch.Tensor, x: LossInputs) -> torch.Tensor:
    """Mean over each sequence's tokens, then mean over the minibatch's sequences (empty
    sequences count 0)."""
    per_seq_N = (obj_NT * x.mask_NT).sum(dim=1) / x.mask_NT.sum(dim=1).clamp(min=1)
    return per_seq_N.sum() / x.num_sequences


def token_mean(obj_NT: torch.Tensor, x: LossInputs) -> torch.Tensor:
    """Mean over every action token in the minibatch."""
    return (obj_NT * x.mask_NT).sum() / x.num_tokens


# --- the registry ---


@register("importance_sampling")
def importance_sampling_loss(x: LossInputs, cfg: LossConfig) -> torch.Tensor:
    return -sequence_sum_mean(importance_weighted(x), x)


@register("ppo")
def ppo_loss(x: LossInputs, cfg: LossConfig) -> torch.Tensor:
    return -sequence_sum_mean(clipped(x, cfg), x)


@register("grpo")
def grpo_loss(x: LossInputs, cfg: LossConfig) -> torch.Tensor:
    return -sequence_mean_mean(clipped(x, cfg), x)


@register("bnpo")
def bnpo_loss(x: LossInputs, cfg: LossConfig) -> torch.Tensor:
    return -token_mean(clipped(x, cfg), x)


register("dapo")(bnpo_loss)  # DAPO's difference is its preset's settings (conf/loss/dapo.yaml)


@register("dr_grpo")
def dr_grpo_loss(x: LossInputs, cfg: LossConfig) -> torch.Tensor:
    return -(clipped(x, cfg) * x.mask_NT).sum() / (x.num_sequences * x.max_tokens)
