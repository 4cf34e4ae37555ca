"""The learner's micro-batches: a minibatch's rollouts in pieces of at most a token budget.

A piece is a run of consecutive rollouts whose forward holds at most `learner_batch_tokens`
tokens: each distinct prompt's tokens once (prompts are shared within a piece) plus the
completion width for each rollout. Activations, and the logits' chunks, then grow with the
budget, not with the minibatch. The losses normalise by the whole minibatch's sequences and
tokens (trainer/rl/losses.py), so the pieces' gradients add up to the minibatch's exactly.

A piece may split a group: the bound then holds whatever the group's size (8 rollouts of 1,024
tokens fit no 4,096-token piece whole), and a split costs only the group's prompt run once more,
in the next piece; the gradient is the same, since the prompt's positions get each rollout's
share in whichever piece holds it. A single rollout over the budget is a piece of its own.

`learner_batch_tokens=auto` (the default) sizes the budget from the model: as many tokens as
keep one piece's saved activations within ACTIVATION_BUDGET_BYTES (token_budget).
"""

from __future__ import annotations

import torch

# auto's memory for one micro-batch's saved activations (SmolLM2-135M's peak at the default
# batch with it: bench/BENCHMARKS.md); the tiny model's default batch is one piece. On a large
# GPU a bigger learner_batch_tokens is faster.
ACTIVATION_BUDGET_BYTES = 2 * 2**30
# Values a decoder layer keeps for the backward, per token, in units of its widths: about 16
# of the hidden width (norms, q/k/v/o and attention, LoRA's inputs, residuals) and 6 of the
# MLP's (gate, up, their activation and product). Fitted to SmolLM2-135M's measured peak
# memory (the estimate against the measurement: bench/BENCHMARKS.md, "Real-model memory").
HIDDEN_VALUES, MLP_VALUES = 16, 6


def token_budget(
    setting: int | str,
    layers: int,
    hidden: int,
    mlp: int,
    bytes_per_value: int,
    checkpointed: bool = False,
    budget_bytes: int = ACTIVATION_BUDGET_BYTES,
) -> int:
    """The learner's tokens per micro-batch: `setting` itself, or for "auto" the most tokens
    whose activations fit budget_bytes. Checkpointed layers keep only their input (one hidden
    width each) and recompute one layer's activations at a time in the backward."""
    if setting != "auto":
        return int(setting)
    layer = (HIDDEN_VALUES * hidden + MLP_VALUES * mlp) * bytes_per_value
    per_token = layers * hidden * bytes_per_value + layer if checkpointed else layers * layer
    return max(1, budget_bytes // per_token)


def model_token_budget(
    setting: int | str, shape, dtype: torch.dtype, checkpointed: bool = False
) -> int:
    """token_budget for a model: its transformers config (`shape`: layers and widths) and the
    dtype it runs in."""
    return token_budget(
        setting,
        layers=shape.num_hidden_layers,
        hidden=shape.hidden_size,
        mlp=getattr(shape, "intermediate_size", None) or 4 * shape.hidden_size,
        bytes_per_value=dtype.itemsize,
        checkpointed=checkpointed,
    )


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


def piece_tokens(
    rows_R: torch.Tensor, prompt_of_N: torch.Tensor, prompt_tokens_D: torch.Tensor, width: int
) -> int:
    """The tokens one piece's forward holds, as split_rows counts them: each distinct prompt's
    tokens once, plus the completion width per rollout."""
    prompts = prompt_of_N[rows_R].unique()
    return int(prompt_tokens_D[prompts].sum()) + len(rows_R) * width
