"""Sampling for several members (trials) in one KV-cached decode, each row through its own
member's adapter (trainer/packed/grouped_lora.py), each member drawing from its own generator.

It is the torch sampler's decode (trainer/sampling/torch_sampler.py) with the rows of K members
stacked, and two differences that keep every member's draws what they would be alone:

1) Each member's tokens are drawn by `draw` on its own rows with its own generator, whose state
   is what torch's default generator held in the member's solo run (trainer/packed/host.py).
   Drawing one member's rows consumes exactly the random numbers its solo run would.
2) A member stops drawing at the step its solo run would have stopped (all its rows ended);
   its rows keep running as padding until every member has stopped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.model.kv_cache import make_room, prefill_shared, with_cache
from trainer.model.rollout import Rollout
from trainer.model.token_batch import left_pad
from trainer.packed.grouped_lora import PackedAdapters, Segments
from trainer.sampling.protocol import SamplingSettings
from trainer.sampling.torch_sampler import _ended_at, draw, logits_warpers


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
        tokens_NT, logp_NT = _decode(
            model,
            input_ids_DS.to(device),
            attention_mask_DS.to(device),
            torch.tensor(prompt_rows, device=device),
            settings,
            sorted(eos),
            tokenizer.pad_token_id,
            [
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


def _decode(
    model: torch.nn.Module,
    input_ids_DS: torch.Tensor,
    attention_mask_DS: torch.Tensor,
    prompt_rows_N: torch.Tensor,
    settings: SamplingSettings,
    eos_ids: list[int],
    pad_id: int,
    members: list[tuple[torch.Generator, int, int]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """torch_sampler.decode over the stacked rows; each member (its generator and rows) draws
    on its own rows until they have all ended, as its solo decode would."""
    warpers = logits_warpers(settings)
    logits_NV, cache, position_N1, padded = prefill_shared(
        model, input_ids_DS, attention_mask_DS, prompt_rows_N
    )
    make_room(cache, settings.max_tokens - 1)
    mask_NL = attention_mask_DS[prompt_rows_N]
    seen_NL = input_ids_DS[prompt_rows_N]
    ended_N = torch.zeros(len(prompt_rows_N), dtype=torch.bool, device=input_ids_DS.device)
    eos_E = torch.tensor(eos_ids, device=input_ids_DS.device)
    drawing = list(members)  # members still drawing
    tokens, logps = [], []
    for t in range(settings.max_tokens):
        scores_NV = logits_NV.float() / settings.temperature
        logp_NV = torch.log_softmax(scores_NV, dim=-1)
        if settings.greedy:
            token_N = scores_NV.argmax(-1)
        else:
            drawn_NV = warpers(seen_NL, scores_NV) if warpers else scores_NV
            probs_NV = torch.softmax(drawn_NV, dim=-1)
            token_N = torch.full_like(ended_N, pad_id, dtype=torch.long)
            for generator, start, end in drawing:
                token_N[start:end] = draw(probs_NV[start:end], generator)
        token_N = token_N.masked_fill(ended_N, pad_id)
        tokens.append(token_N)
        logps.append(logp_NV.gather(-1, token_N[:, None])[:, 0])
        ended_N = ended_N | torch.isin(token_N, eos_E)
        drawing = [m for m in drawing if not bool(ended_N[m[1] : m[2]].all())]
        if t == settings.max_tokens - 1 or not drawing:
            break
        if padded:
            mask_NL = torch.cat([mask_NL, mask_NL.new_ones(len(mask_NL), 1)], dim=1)
        position_N1 = position_N1 + 1
        if warpers:
            seen_NL = torch.cat([seen_NL, token_N[:, None]], dim=1)
        logits_NV = model(
            input_ids=token_N[:, None],
            attention_mask=mask_NL if padded else None,
            position_ids=position_N1,
            **with_cache(model, cache),
            use_cache=True,
        ).logits[:, -1]
    return torch.stack(tokens, dim=1).cpu(), torch.stack(logps, dim=1).cpu()
