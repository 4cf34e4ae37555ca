"""A GRPO group as one row: its prompt's tokens once, then each rollout's completion inputs,
under a block-causal mask, so that each rollout sees the prompt and its own earlier tokens and
none of its siblings'.

The learner's other way to run each prompt once is to run the prompts first and share their
cached keys and values (`kv_cache.prefill_shared`). Both compute the same attention, so the
log-probs and gradients are the same. Packing does it in one forward call instead of two, with
no cache to index through in the backward: faster on the tiny model's short rows
(bench/BENCHMARKS.md has the measurement). Its cost is attention over the whole row under a dense mask
(row length squared per group), so it serves short rows only (`MAX_ROW_TOKENS`); long
completions keep the shared cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Up to here a row's dense mask is small (256^2 per group: 64 groups take 16 MiB in float32)
# and the attention it spends on masked pairs is a few percent of the linear layers' work
# (about row_length / (6 * hidden_size) of it).
MAX_ROW_TOKENS = 256
PROMPT, FILLER = -1, -2  # segment ids besides the rollouts' own 0..N-1
MASKABLE_ATTENTION = ("sdpa", "eager")  # the implementations that take a 4D additive mask


@dataclass(frozen=True)
class PackedRows:
    ids_DL: torch.Tensor
    positions_DL: torch.Tensor
    allowed_DLL: torch.Tensor  # query column attends to key column
    row_N: torch.Tensor  # each rollout's row: its prompt's
    columns_NT: torch.Tensor  # the columns whose logits predict each completion token


def row_length(prompt_mask_DS: torch.Tensor, prompt_of_N: torch.Tensor, steps: int) -> int:
    """The longest row: a prompt's real tokens plus `steps` inputs for each of its rollouts."""
    rollouts_D = torch.bincount(prompt_of_N, minlength=len(prompt_mask_DS))
    return int((prompt_mask_DS.sum(-1) + rollouts_D * steps).max())


def can_pack(model: torch.nn.Module, width: int) -> bool:
    return width <= MAX_ROW_TOKENS and model.config._attn_implementation in MASKABLE_ATTENTION


def pack_groups(
    prompt_ids_DS: torch.Tensor,
    prompt_mask_DS: torch.Tensor,
    prompt_of_N: torch.Tensor,
    inputs_NT: torch.Tensor,
) -> PackedRows:
    """Rows of [prompt d's real tokens, then the inputs of each rollout of d in batch order],
    right-filled to the longest row. Positions restart after the prompt for every rollout, as
    if each ran alone after it. Filler columns see only filler, so no row of the softmax is
    empty; nothing reads them."""
    num_prompts, prompt_width = prompt_ids_DS.shape
    num_rollouts, steps = inputs_NT.shape
    device = inputs_NT.device
    length_D = prompt_mask_DS.sum(-1)
    rollouts_D = torch.bincount(prompt_of_N, minlength=num_prompts)
    width = row_length(prompt_mask_DS, prompt_of_N, steps)
    columns_L = torch.arange(width, device=device)

    # The prompt's real tokens first (its left padding dropped), then filler.
    in_prompt_DL = columns_L < length_D[:, None]
    source_DL = (prompt_width - length_D[:, None] + columns_L).clamp(max=prompt_width - 1)
    ids_DL = torch.where(in_prompt_DL, prompt_ids_DS.gather(1, source_DL), 0)
    positions_DL = torch.where(in_prompt_DL, columns_L, 0)
    segment_DL = torch.where(in_prompt_DL, PROMPT, FILLER)

    # Each rollout's slot among its prompt's rollouts, then its columns after the prompt.
    order_N = torch.argsort(prompt_of_N, stable=True)
    first_of_D = rollouts_D.cumsum(0) - rollouts_D
    slot_N = torch.empty_like(prompt_of_N)
    slot_N[order_N] = torch.arange(num_rollouts, device=device) - first_of_D[prompt_of_N[order_N]]
    length_N = length_D[prompt_of_N]
    steps_T = torch.arange(steps, device=device)
    inputs_at_NT = (length_N + slot_N * steps)[:, None] + steps_T
    row_NT = prompt_of_N[:, None].expand(-1, steps)
    ids_DL[row_NT, inputs_at_NT] = inputs_NT
    positions_DL[row_NT, inputs_at_NT] = length_N[:, None] + steps_T
    segment_DL[row_NT, inputs_at_NT] = torch.arange(num_rollouts, device=device)[:, None]

    query, key = segment_DL[:, :, None], segment_DL[:, None, :]
    causal_LL = columns_L[:, None] >= columns_L[None, :]
    allowed_DLL = causal_LL & ((key == query) | ((key == PROMPT) & (query >= 0)))
    # The prompt's last token predicts the first completion token; input t predicts token t+1.
    columns_NT = torch.cat([(length_N - 1)[:, None], inputs_at_NT], dim=1)
    return PackedRows(ids_DL, positions_DL, allowed_DLL, prompt_of_N, columns_NT)


def packed_logits(model: torch.nn.Module, rows: PackedRows) -> torch.Tensor:
    """The logits at rows.columns_NT, from one forward call over the packed rows. Only the
    columns from the first one read onward reach the output layer."""
    additive_DLL = additive_mask(rows, model.get_input_embeddings().weight.dtype)
    skipped = int(rows.columns_NT.min())
    logits_DLV = model(
        input_ids=rows.ids_DL,
        position_ids=rows.positions_DL,
        attention_mask=additive_DLL[:, None],
        logits_to_keep=rows.ids_DL.shape[1] - skipped,
        use_cache=False,  # one call: a cache would only copy every layer's keys and values
    ).logits
    return logits_DLV[rows.row_N[:, None], rows.columns_NT - skipped]


def packed_hidden(decoder: torch.nn.Module, rows: PackedRows) -> torch.Tensor:
    """packed_logits before the output layer: the decoder's final hidden states at
    rows.columns_NT (trainer/model/logprobs.py runs the output layer in chunks)."""
    hidden_DLF = decoder(
        input_ids=rows.ids_DL,
        position_ids=rows.positions_DL,
        attention_mask=additive_mask(rows, decoder.get_input_embeddings().weight.dtype)[:, None],
        use_cache=False,
    ).last_hidden_state
    return hidden_DLF[rows.row_N[:, None], rows.columns_NT]


def additive_mask(rows: PackedRows, dtype: torch.dtype) -> torch.Tensor:
    """0 where a query column may attend to a key column, the dtype's lowest value elsewhere."""
    additive_DLL = torch.zeros(rows.allowed_DLL.shape, dtype=dtype, device=rows.ids_DL.device)
    return additive_DLL.masked_fill_(~rows.allowed_DLL, torch.finfo(dtype).min)
