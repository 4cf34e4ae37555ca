"""The policy's token log-probs, fast: `FastPasses`, the passes `Policy.logprobs` and
`Policy.learner_pieces` (trainer/model/policy.py) run by default.

The numbers are plain_logprobs.py's (one ordinary forward over every rollout, prompt and
completion in one row; tests/test_plain_logprobs.py holds them equal). What makes them fast:

- micro-batches: a minibatch's rollouts in pieces of at most `learner_batch_tokens` tokens, so
  activations grow with the budget, not the minibatch (trainer/model/micro_batches.py);
- each distinct prompt runs once for its whole group: packed into one row with its rollouts
  under a block-causal mask (trainer/model/packing.py), or, past a short row, prefilled first
  and its keys and values shared with the rollouts (trainer/model/kv_cache.py);
- past one chunk of logits, the output layer runs on the final hidden states in chunks
  (trainer/model/logprobs.py): memory does not grow with tokens x vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from trainer.model import logprobs, micro_batches, packing
from trainer.model.activation_checkpointing import prefill_unchecked
from trainer.model.kv_cache import prefill_shared, prompt_cache, with_cache
from trainer.model.token_batch import TokenBatch


@dataclass
class FastPasses:
    """The policy's log-prob passes in micro-batches, each prompt once, the output layer in
    chunks (trainer/model/policy.py's `LogprobPasses`)."""

    # Tokens per micro-batch (load_policy sizes it from learner_batch_tokens,
    # trainer/model/micro_batches.py); None: every batch in one piece.
    learner_batch_tokens: int | None = None

    def logprobs(
        self, model: torch.nn.Module, batch: TokenBatch, temperature: float
    ) -> torch.Tensor:
        """Every rollout's token log-probs, one micro-batch at a time."""
        rows = torch.arange(len(batch.prompt_of_N), device=batch.prompt_of_N.device)
        parts = [batch.select(piece) for piece in self.micro_batches(batch, rows)]
        return torch.cat([token_logprobs(model, part, temperature)[0] for part in parts])

    def learner_pieces(
        self, model: torch.nn.Module, batch: TokenBatch, rows: torch.Tensor, temperature: float
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(piece, logp_NT, entropy_NT) for each micro-batch of the given rollouts."""
        for piece in self.micro_batches(batch, rows):
            part = batch.select(piece)
            logp_NT, entropy_NT = token_logprobs(model, part, temperature, with_entropy=True)
            yield piece, logp_NT, entropy_NT

    def micro_batches(self, batch: TokenBatch, rows: torch.Tensor) -> list[torch.Tensor]:
        """These rollouts (row indices of `batch`) in consecutive pieces of at most
        learner_batch_tokens tokens (trainer/model/micro_batches.py)."""
        if self.learner_batch_tokens is None:
            return [rows]
        prompt_tokens_D = batch.prompt_mask_DS.sum(-1)
        width = batch.completion_ids_NT.shape[1]
        return micro_batches.split_rows(
            rows, batch.prompt_of_N, prompt_tokens_D, width, self.learner_batch_tokens
        )


def token_logprobs(
    model: torch.nn.Module, batch: TokenBatch, temperature: float, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the completions' tokens under the model's tempered distribution (and
    their entropy).

    Each distinct prompt runs once and serves all its rollouts (packed into one row with them,
    or through its cached keys and values, as in the sampler): a group's prompt costs what one
    rollout's does, not G times that, and the gradient reaches the prompt's positions as it
    would through G copies. Past one chunk of logits, the output layer runs in chunks
    (trainer/model/logprobs.py): memory does not grow with tokens x vocabulary.
    """
    ids_NT = batch.completion_ids_NT
    vocab_size = model.get_output_embeddings().weight.shape[0]
    if logprobs.fits_one_chunk(ids_NT.numel(), vocab_size):
        logits_NTV = completion_logits(model, batch)
        return logprobs.logprobs_from_logits(logits_NTV, ids_NT, temperature, with_entropy)
    head = logprobs.plain_output_layer(model)
    if head is None:  # the model's own logits, scored in chunks
        logits_NTV = completion_logits(model, batch)
        return logprobs.chunked_logprobs(logits_NTV, ids_NT, temperature, None, with_entropy)
    first_NV, hidden_NTF = completion_hidden(model, batch)
    scored_NT = ids_NT if first_NV is None else ids_NT[:, 1:]
    parts = [
        logprobs.chunked_logprobs(hidden_NTF, scored_NT, temperature, head.weight, with_entropy)
    ]
    if first_NV is not None:  # the prompt's last position, from the prefill's logits
        first = logprobs.chunked_logprobs(
            first_NV[:, None], ids_NT[:, :1], temperature, None, with_entropy
        )
        parts.insert(0, first)
    logp_NT = torch.cat([p[0] for p in parts], dim=1)
    entropy_NT = torch.cat([p[1] for p in parts], dim=1) if with_entropy else None
    return logp_NT, entropy_NT


def completion_logits(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """The logits that predict each completion token: the prompt's last position predicts the
    first, completion token t-1 predicts token t. Short groups run packed, one row each;
    longer ones run their prompts first and share the cache (the same attention either way)."""
    inputs_NT = batch.completion_ids_NT[:, :-1]  # the last token predicts nothing we score
    steps = inputs_NT.shape[1]
    if packing.can_pack(model, packing.row_length(batch.prompt_mask_DS, batch.prompt_of_N, steps)):
        rows = packing.pack_groups(
            batch.prompt_ids_DS, batch.prompt_mask_DS, batch.prompt_of_N, inputs_NT
        )
        return packing.packed_logits(model, rows)
    return shared_prefix_logits(model, batch, inputs_NT)


def completion_hidden(
    model: torch.nn.Module, batch: TokenBatch
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """completion_logits before the output layer: the final hidden states that predict each
    completion token. Packed, all of them; through the shared cache, the prefill's logits for
    the first token (one position a rollout) and the hidden states for the rest."""
    inputs_NT = batch.completion_ids_NT[:, :-1]
    steps = inputs_NT.shape[1]
    decoder = model.get_decoder()
    if packing.can_pack(model, packing.row_length(batch.prompt_mask_DS, batch.prompt_of_N, steps)):
        rows = packing.pack_groups(
            batch.prompt_ids_DS, batch.prompt_mask_DS, batch.prompt_of_N, inputs_NT
        )
        return None, packing.packed_hidden(decoder, rows)
    with prefill_unchecked(model):
        first_NV, cache, last_N1, padded = prefill_shared(
            model, batch.prompt_ids_DS, batch.prompt_mask_DS, batch.prompt_of_N
        )
    if steps == 0:
        return first_NV, first_NV.new_zeros(len(first_NV), 0, decoder.config.hidden_size)
    rest = decoder(**completion_inputs(decoder, batch, inputs_NT, cache, last_N1, padded))
    return first_NV, rest.last_hidden_state


def completion_inputs(
    model: torch.nn.Module,
    batch: TokenBatch,
    inputs_NT: torch.Tensor,
    cache,
    last_N1: torch.Tensor,
    padded: bool,
) -> dict:
    """The completions' forward after the shared prompts' prefill. Right padding of the
    completions needs no mask: under the causal mask no real token sees a later pad. Only
    left-padded prompts need one."""
    attention_mask = None
    if padded:
        attention_mask = torch.cat(
            [batch.prompt_mask_DS[batch.prompt_of_N], torch.ones_like(inputs_NT)], dim=1
        )
    steps_T = torch.arange(1, inputs_NT.shape[1] + 1, device=inputs_NT.device)
    return dict(
        input_ids=inputs_NT,
        attention_mask=attention_mask,
        position_ids=last_N1 + steps_T,
        **with_cache(model, prompt_cache(cache)),
        use_cache=True,
    )


def shared_prefix_logits(
    model: torch.nn.Module, batch: TokenBatch, inputs_NT: torch.Tensor
) -> torch.Tensor:
    """completion_logits with each distinct prompt run first, its keys and values then indexed
    out to its rollouts, whose completions run against them in a second call."""
    with prefill_unchecked(model):
        first_NV, cache, last_N1, padded = prefill_shared(
            model, batch.prompt_ids_DS, batch.prompt_mask_DS, batch.prompt_of_N
        )
    if inputs_NT.shape[1] == 0:
        return first_NV[:, None]
    rest_NTV = model(**completion_inputs(model, batch, inputs_NT, cache, last_N1, padded)).logits
    return torch.cat([first_NV[:, None], rest_NTV], dim=1)
