"""Several members' TokenBatches as one, each member's rows together (member-major).

Prompts are not shared across members even when equal: a prompt's keys and values go through
its own member's adapter. Prompts are left-padded and completions right-padded to the widest
member's; the padding sits where a solo batch's own padding sits (before a prompt, after a
completion), where no real token attends to it, so each member's real tokens compute what they
would alone, up to float rounding.
"""

from __future__ import annotations

import math

import torch

from trainer.model.micro_batches import piece_tokens
from trainer.model.token_batch import TokenBatch


def concat(
    members: list[int], batches: list[TokenBatch], pad_id: int
) -> tuple[TokenBatch, dict[int, list[tuple[int, int, int]]], dict[int, tuple[int, int, int]]]:
    """(the batch, its owners by row count, each member's (first row, end row, completion
    width)): the owners of prompt rows and of rollout rows, as grouped_lora.Segments reads."""
    prompt_width = max(b.prompt_ids_DS.shape[1] for b in batches)
    width = max(b.completion_ids_NT.shape[1] for b in batches)
    prompt_rows, rollout_rows, owners = [], [], {}
    d = n = 0
    for member, b in zip(members, batches, strict=True):
        num_prompts, num_rollouts = len(b.prompt_ids_DS), len(b.prompt_of_N)
        prompt_rows.append((member, d, d + num_prompts))
        rollout_rows.append((member, n, n + num_rollouts))
        owners[member] = (n, n + num_rollouts, b.completion_ids_NT.shape[1])
        d, n = d + num_prompts, n + num_rollouts
    offsets = [start for _, start, _ in prompt_rows]
    batch = TokenBatch(
        torch.cat([_pad_left(b.prompt_ids_DS, prompt_width, pad_id) for b in batches]),
        torch.cat([_pad_left(b.prompt_mask_DS, prompt_width, 0) for b in batches]),
        torch.cat([b.prompt_of_N + o for b, o in zip(batches, offsets, strict=True)]),
        torch.cat([_pad_right(b.completion_ids_NT, width, pad_id) for b in batches]),
        torch.cat([_pad_right(b.mask_NT, width, 0) for b in batches]),
        torch.cat([_pad_right(b.sampler_logp_NT, width, 0) for b in batches]),
        torch.cat([b.finished_N for b in batches]),
    )
    return batch, {d: prompt_rows, n: rollout_rows}, owners


def _pad_left(x: torch.Tensor, width: int, value) -> torch.Tensor:
    return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)


def _pad_right(x: torch.Tensor, width: int, value) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)


def learner_round(requests: list[tuple[TokenBatch, torch.Tensor, int | None]]) -> int:
    """How many of the members' learner pieces (batch, rows, token budget), in member order,
    run together this round: while their tokens fit one piece's budget (the least the members
    ask for; None: no limit), so the pack's forward holds a solo run's activations. The first
    always runs."""
    limit = min(budget or math.inf for _, _, budget in requests)
    taken = used = 0
    for batch, rows, _ in requests:
        tokens = piece_tokens(
            rows, batch.prompt_of_N, batch.prompt_mask_DS.sum(-1), batch.completion_ids_NT.shape[1]
        )
        if taken and used + tokens > limit:
            break
        taken, used = taken + 1, used + tokens
    return taken
