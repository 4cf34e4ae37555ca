"""The learner's micro-batches: a minibatch's rollouts in pieces of at most a token budget.

A piece is a run of consecutive rollouts whose forward holds at most `learner_batch_tokens`
tokens: each distinct prompt's tokens once (prompts are shared within a piece) plus the
completion width for each rollout. Activations, and the logits' chunks, then grow with the
budget, not with the minibatch. The losses normalise by the whole minibatch's sequences and
tokens (trainer/losses.py), so the pieces' gradients add up to the minibatch's exactly.

A piece may split a group: the bound then holds whatever the group's size (8 rollouts of 1,024
tokens fit no 4,096-token piece whole), and a split costs only the group's prompt run once more,
in the next piece; the gradient is the same, since the prompt's positions get each rollout's
share in whichever piece holds it. A single rollout over the budget is a piece of its own.
"""

from __future__ import annotations

import torch


def split_rows(
    rows_R: torch.Tensor,
    prompt_of_N: torch.Tensor,
    prompt_tokens_D: torch.Tensor,
    completion_width: int,
    budget: int,
) -> list[torch.Tensor]:
    """rows_R (rollout indices, in order) cut into consecutive pieces of at most `budget`
    tokens: each distinct prompt's tokens once, plus completion_width per rollout."""
    prompts_R = prompt_of_N[rows_R].tolist()
    prompt_tokens = prompt_tokens_D.tolist()
    pieces, start, used, seen = [], 0, 0, set()
    for i, prompt in enumerate(prompts_R):
        cost = completion_width + (0 if prompt in seen else prompt_tokens[prompt])
        if used + cost > budget and i > start:
            pieces.append(rows_R[start:i])
            start, used, seen = i, 0, set()
            cost = completion_width + prompt_tokens[prompt]
        used += cost
        seen.add(prompt)
    if start < len(prompts_R):
        pieces.append(rows_R[start:])
    return pieces
