"""Token log-probs the plain way: one ordinary Hugging Face forward over the whole batch.

The numbers `Policy.logprobs` and `Policy.learner_pieces` (trainer/model/policy.py) compute,
without what makes them fast (trainer/model/fast_logprobs.py): no micro-batches, no packed
groups, no shared prompt cache, no output layer in chunks. Each rollout is a row of its own,
its prompt (left-padded) then its completion (right-padded), and the logits one position before
each completion token score it. `PlainPasses` runs the policy's passes this way. For reading,
and for the tests that hold the fast paths to it (tests/test_plain_logprobs.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from trainer.model.token_batch import TokenBatch


class PlainPasses:
    """The policy's log-prob passes (trainer/model/policy.py's `LogprobPasses`) as one plain
    forward: every batch in one piece."""

    learner_batch_tokens = None

    def logprobs(
        self, model: torch.nn.Module, batch: TokenBatch, temperature: float
    ) -> torch.Tensor:
        return plain_token_logprobs(model, batch, temperature)[0]

    def learner_pieces(
        self, model: torch.nn.Module, batch: TokenBatch, rows: torch.Tensor, temperature: float
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        logp_NT, entropy_NT = plain_token_logprobs(model, batch.select(rows), temperature)
        yield rows, logp_NT, entropy_NT.detach()  # the entropy is a statistic: no gradient


def plain_token_logprobs(
    model: torch.nn.Module, batch: TokenBatch, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-prob of each completion token, entropy of the distribution it was drawn from) under
    the model's tempered distribution: N x T each, aligned to the completion tokens."""
    prompt_ids_NS = batch.prompt_ids_DS[batch.prompt_of_N]  # each rollout its own prompt copy
    prompt_mask_NS = batch.prompt_mask_DS[batch.prompt_of_N]
    ids_NL = torch.cat([prompt_ids_NS, batch.completion_ids_NT], dim=1)
    mask_NL = torch.cat([prompt_mask_NS, batch.mask_NT.to(prompt_mask_NS.dtype)], dim=1)
    positions_NL = (mask_NL.cumsum(-1) - 1).clamp(min=0)  # left padding shifts no position
    logits_NLV = model(input_ids=ids_NL, attention_mask=mask_NL, position_ids=positions_NL).logits
    # The last prompt position predicts completion token 0, completion token t-1 token t.
    prompt_width, steps = prompt_ids_NS.shape[1], batch.completion_ids_NT.shape[1]
    logits_NTV = logits_NLV[:, prompt_width - 1 : prompt_width - 1 + steps]
    # At least float32 (bfloat16 logits are scored in float32; float64 stays float64).
    logits_NTV = logits_NTV.to(torch.promote_types(logits_NTV.dtype, torch.float32))
    logp_NTV = torch.log_softmax(logits_NTV / temperature, dim=-1)
    logp_NT = logp_NTV.gather(-1, batch.completion_ids_NT[..., None])[..., 0]
    entropy_NT = -(logp_NTV.exp() * logp_NTV).sum(-1)
    return logp_NT, entropy_NT
