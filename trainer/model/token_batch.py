"""Rollouts as tensors: `collate` turns the sampler's rollouts into a `TokenBatch`, the one
input of the policy's log-prob passes (trainer/model/policy.py).

Prompts are padded on the left (generation appends on the right, and the sampler pads its
prompts the same way: `left_pad`), completions on the right.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.model.rollout import Rollout


@dataclass(frozen=True)
class TokenBatch:
    """Rollouts as tensors, each distinct prompt once (a GRPO group shares its prompt).

    Prompts are left-padded, a row per distinct prompt; completions are right-padded, a row per
    rollout, and `prompt_of_N` names the prompt row each rollout continues. Per-token (`_NT`)
    tensors are aligned to completion tokens: position t is completion token t.
    """

    prompt_ids_DS: torch.Tensor  # left-padded
    prompt_mask_DS: torch.Tensor  # 1 on real prompt tokens
    prompt_of_N: torch.Tensor
    completion_ids_NT: torch.Tensor  # right-padded
    mask_NT: torch.Tensor  # 1 on completion tokens
    sampler_logp_NT: torch.Tensor
    finished_N: torch.Tensor  # 1.0 where the completion ended with end-of-sequence

    def to(self, device: torch.device) -> TokenBatch:
        return TokenBatch(*(t.to(device) for t in self.__dict__.values()))

    def select(self, rows: torch.Tensor) -> TokenBatch:
        """The given rollouts, with only the prompts they continue."""
        used_D, prompt_of_N = torch.unique(self.prompt_of_N[rows], return_inverse=True)
        prompt_mask_DS = self.prompt_mask_DS[used_D]
        width = int(prompt_mask_DS.sum(-1).max())  # drop the columns that are padding only
        return TokenBatch(
            self.prompt_ids_DS[used_D, -width:],
            prompt_mask_DS[:, -width:],
            prompt_of_N,
            self.completion_ids_NT[rows],
            self.mask_NT[rows],
            self.sampler_logp_NT[rows],
            self.finished_N[rows],
        )


def collate(rollouts: list[Rollout], pad_id: int) -> TokenBatch:
    """The rollouts as one TokenBatch, in their order: each distinct prompt once, left-padded;
    each completion, its mask and the sampler's log-probs right-padded to the longest."""
    prompt_row = {p: d for d, p in enumerate(dict.fromkeys(tuple(r.prompt_ids) for r in rollouts))}
    prompt_ids_DS, prompt_mask_DS = left_pad([list(p) for p in prompt_row], pad_id)
    prompt_of_N = torch.tensor([prompt_row[tuple(r.prompt_ids)] for r in rollouts])
    # One tensor from padded lists: one copy, not one per rollout.
    width = max(len(r.completion_ids) for r in rollouts)
    ids = torch.tensor([right_pad(r.completion_ids, width, pad_id) for r in rollouts])
    mask = torch.tensor([right_pad([1.0] * len(r.completion_ids), width, 0.0) for r in rollouts])
    sampler_logp = torch.tensor([right_pad(r.sampler_logps, width, 0.0) for r in rollouts])
    finished = torch.tensor([float(r.finished) for r in rollouts])
    return TokenBatch(prompt_ids_DS, prompt_mask_DS, prompt_of_N, ids, mask, sampler_logp, finished)


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows as a left-padded tensor and its attention mask (generation appends right).
    One tensor built from padded lists, not a copy per row."""
    width = max(map(len, rows))
    ids = [[pad_id] * (width - len(row)) + list(row) for row in rows]
    mask = [[0] * (width - len(row)) + [1] * len(row) for row in rows]
    return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)


def right_pad(row: list, width: int, value: float) -> list:
    return [*row, *[value] * (width - len(row))]
