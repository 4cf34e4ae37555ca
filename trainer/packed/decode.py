"""Sampling for several members (trials) in one KV-cached decode, each row through its own
member's adapter (trainer/packed/grouped_lora.py), each member drawing from its own generator.

It is the torch sampler's decode (trainer/sampling/torch_sampler.py, its `members`): the rows
of K members stacked, and two differences that keep every member's draws what they would be
alone:

1) Each member's tokens are drawn by `draw` on its own rows with its own generator, whose state
   is what torch's default generator held in the member's solo run (trainer/packed/host.py).
   Drawing one member's rows consumes exactly the random numbers its solo run would.
2) A member stops drawing at the step its solo run would have stopped (all its rows ended);
   its rows keep running as padding until every member has stopped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.model.rollout import Rollout
from trainer.model.token_batch import left_pad
from trainer.packed.grouped_lora import PackedAdapters, Segments
from trainer.sampling.protocol import SamplingSettings
from trainer.sampling.torch_sampler import _ended_at, decode


@dataclass
class Chunk:
    """One member's share of a packed decode: the distinct prompts its rows continue, each
    row's prompt (an index into prompts_D) and the generator it draws from."""

    member: int
    prompts_D: list[list[int]]
    rows_N: list[int]
    generator: torch.Generator


def chunks_of(ids_N: list[tuple[int, ...]], batch_tokens: int, max_tokens: int):
    """A member's prompts in the chunks the torch sampler decodes them in: (distinct prompts,
    each chunk's rows). The same split as TorchSampler.sample: each chunk's draws come from the
    generator in the same order as alone."""
    row_of = {ids: d for d, ids in enumerate(dict.fromkeys(ids_N))}
    ids_D = [list(ids) for ids in row_of]
    rows_N = [row_of[ids] for ids in ids_N]
    per_chunk = max(1, batch_tokens // (max(map(len, ids_D)) + max_tokens))
    return ids_D, [rows_N[s : s + per_chunk] for s in range(0, len(rows_N), per_chunk)]


@torch.inference_mode()
def decode_packed(
    model: torch.nn.Module,
    packed: PackedAdapters,
    chunks: list[Chunk],
    settings: SamplingSettings,
    eos: frozenset[int],
    tokenizer,
) -> list[list[Rollout]]:
    """Each chunk's rollouts, in its rows' order, from one decode over every chunk's rows."""
    device = next(model.parameters()).device
    prompts, prompt_rows, segments_D, segments_N = [], [], [], []
    for chunk in chunks:
        used = list(dict.fromkeys(chunk.rows_N))
        local = {d: len(prompts) + i for i, d in enumerate(used)}
        segments_D.append((chunk.member, len(prompts), len(prompts) + len(used)))
        segments_N.append((chunk.member, len(prompt_rows), len(prompt_rows) + len(chunk.rows_N)))
        prompts += [chunk.prompts_D[d] for d in used]
        prompt_rows += [local[d] for d in chunk.rows_N]
    input_ids_DS, attention_mask_DS = left_pad(prompts, tokenizer.pad_token_id)
    segments = Segments({len(prompts): segments_D, len(prompt_rows): segments_N})
    with packed.rows(segments):
        tokens_NT, logp_NT = decode(
            model,
            input_ids_DS.to(device),
            attention_mask_DS.to(device),
            torch.tensor(prompt_rows, device=device),
            settings,
            sorted(eos),
            tokenizer.pad_token_id,
            members=[
                (c.generator, start, end)
                for c, (_, start, end) in zip(chunks, segments_N, strict=True)
            ],
        )
    tokens, logps = tokens_NT.tolist(), logp_NT.tolist()
    out = []
    for chunk, (_, start, end) in zip(chunks, segments_N, strict=True):
        rows, row_logps = tokens[start:end], logps[start:end]
        lengths = [_ended_at(row, eos) for row in rows]
        completions = [row[:n] for row, n in zip(rows, lengths, strict=True)]
        texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
        out.append(
            [
                Rollout(chunk.prompts_D[d], completion, lp[:n], completion[-1] in eos, text)
                for d, completion, lp, n, text in zip(
                    chunk.rows_N, completions, row_logps, lengths, texts, strict=True
                )
            ]
        )
    return out
