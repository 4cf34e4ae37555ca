"""The GRPO math as pure tensor functions, each tested on hand-computed numbers.

Shape suffixes (docs/glossary.md has the legend): P problems, G rollouts per problem (group),
N sequences (= P x G), T completion tokens.
Every per-token tensor comes with a 0/1 `mask_NT` marking action (completion) tokens.
"""

from __future__ import annotations

import torch

from records import metrics
from trainer.base.config import SCALE_REWARDS


def compute_advantages(rewards_PG: torch.Tensor, scale_rewards: str = "none") -> torch.Tensor:
    """Reward minus its group mean, optionally divided by the group's or the batch's std.

    The std is torch's default (Bessel-corrected), as in TRL's GRPO; a small epsilon keeps
    constant groups at exactly zero instead of 0/0.
    """
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards={scale_rewards!r} must be one of {SCALE_REWARDS}")
    centred_PG = rewards_PG - rewards_PG.mean(dim=1, keepdim=True)
    if scale_rewards == "group":
        return centred_PG / (rewards_PG.std(dim=1, keepdim=True) + 1e-6)
    if scale_rewards == "batch":
        return centred_PG / (rewards_PG.std() + 1e-6)
    return centred_PG


def constant_groups(rewards_PG: torch.Tensor) -> torch.Tensor:
    """Bool per problem: every rollout got the same reward, so the group carries no signal."""
    return (rewards_PG == rewards_PG[:, :1]).all(dim=1)


def group_outcome_fractions(rewards_PG: torch.Tensor) -> dict[str, float]:
    """Share of groups with mixed rewards, with every rollout rewarded (> 0), or with none."""
    constant_P = constant_groups(rewards_PG)
    all_good = (constant_P & (rewards_PG[:, 0] > 0)).float().mean().item()
    all_bad = (constant_P & (rewards_PG[:, 0] <= 0)).float().mean().item()
    return {
        metrics.GROUPS_MIXED: (~constant_P).float().mean().item(),
        metrics.GROUPS_ALL_GOOD: all_good,
        metrics.GROUPS_ALL_BAD: all_bad,
        metrics.GROUPS_ZERO_ADVANTAGE: all_good + all_bad,
    }


def masked_mean(x_NT: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
    return (x_NT * mask_NT).sum() / mask_NT.sum().clamp(min=1)


def discounted_future_sum(x_NT: torch.Tensor, gamma: float) -> torch.Tensor:
    """y_t = x_t + gamma * y_{t+1}: each token also carries the discounted terms after it."""
    out_NT = torch.zeros_like(x_NT)
    running_N = torch.zeros_like(x_NT[:, 0])
    for t in range(x_NT.shape[1] - 1, -1, -1):
        running_N = x_NT[:, t] + gamma * running_N
        out_NT[:, t] = running_N
    return out_NT


def kl_penalty(
    sampler_logp_NT: torch.Tensor,
    ref_logp_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    coef: float,
    discount: float = 0.0,
) -> tuple[torch.Tensor, float]:
    """Per-token advantage shaping toward the reference policy.

    kl_t = logp_sampler - logp_ref; shaping_t = coef * (batch mean kl - kl_t), so tokens
    that drifted more than average are pushed back and the batch's mean shaping is zero.
    With discount > 0 each token also pays for the discounted drift that follows it.
    Returns (shaping_NT, mean kl) where the mean kl is logged as kl_policy_ref.
    """
    kl_NT = (sampler_logp_NT - ref_logp_NT) * mask_NT
    mean_kl = masked_mean(kl_NT, mask_NT)
    shaping_NT = coef * (mean_kl - kl_NT) * mask_NT
    if discount > 0:
        shaping_NT = discounted_future_sum(shaping_NT, discount) * mask_NT
    return shaping_NT, mean_kl.item()


def kl_sample_train(
    sampler_logp_NT: torch.Tensor, learner_logp_NT: torch.Tensor, mask_NT: torch.Tensor
) -> tuple[float, float]:
    """KL(sampler || learner) on action tokens, two estimators (Schulman 2020).

    d = logp_sampler - logp_learner; v1 = mean(d) (unbiased, can be negative on a batch),
    v2 = 0.5 * mean(d^2) (biased, never negative, lower variance).
    """
    d_NT = (sampler_logp_NT - learner_logp_NT).detach()
    v1 = masked_mean(d_NT, mask_NT).item()
    v2 = masked_mean(0.5 * d_NT**2, mask_NT).item()
    return v1, v2


def minibatch_rows(
    num_groups: int, group_size: int, num_substeps: int, keep_P: torch.Tensor | None = None
) -> list[torch.Tensor]:
    """Rollout rows of each minibatch: problems split into num_substeps contiguous chunks,
    every rollout of a problem in the same chunk; problems not in keep_P are left out and a
    chunk left empty is dropped (no optimizer step without data).
    """
    minibatches = []
    for problems in torch.arange(num_groups).chunk(num_substeps):
        if keep_P is not None:
            problems = problems[keep_P[problems]]
        if len(problems):
            minibatches.append(
                (problems[:, None] * group_size + torch.arange(group_size)).flatten()
            )
    return minibatches
