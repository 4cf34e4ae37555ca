"""KV-cached decoding on the policy's inference copy (LoRA merged), in this process.

`TorchSampler` stops at end-of-sequence, works on CPU and GPU, and records each token's
log-prob under the tempered policy (trainer/sampling/protocol.py says which). The prompts' shared
prefill is trainer/model/kv_cache.py's, which the learner uses too (trainer/model/fast_logprobs.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers.generation import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from trainer.env.prompts import Prompt, PromptRenderer
from trainer.model.kv_cache import make_room, prefill_shared, with_cache
from trainer.model.rollout import Rollout, eos_ids
from trainer.model.token_batch import left_pad
from trainer.sampling.protocol import SamplingSettings

if TYPE_CHECKING:
    from trainer.model.policy import Policy


def logits_warpers(s: SamplingSettings) -> LogitsProcessorList:
    """transformers' own processors for the settings that shape which token is drawn."""
    warpers = LogitsProcessorList()
    if s.repetition_penalty != 1.0:
        warpers.append(RepetitionPenaltyLogitsProcessor(s.repetition_penalty))
    if s.top_k:
        warpers.append(TopKLogitsWarper(s.top_k))
    if s.top_p < 1.0:
        warpers.append(TopPLogitsWarper(s.top_p))
    if s.min_p:
        warpers.append(MinPLogitsWarper(s.min_p))
    return warpers


class TorchSampler:
    """KV-cached decoding on `Policy.inference()` (LoRA merged), in this process.

    A lean loop instead of `generate`: one forward a token, the last position's logits only,
    stops once every row has ended, and no per-token Python work per row.
    """

    def __init__(
        self, policy: Policy, batch_tokens: int = 8192, renderer: PromptRenderer | None = None
    ) -> None:
        self.policy = policy
        self.batch_tokens = batch_tokens  # prompt + completion tokens decoded at once (memory)
        self.renderer = renderer or PromptRenderer(policy.tokenizer)

    def sync_weights(self) -> None:
        """Nothing to do: the inference copy re-merges whenever the adapter changed."""

    @torch.inference_mode()  # less per-op bookkeeping than no_grad; only lists leave it
    def sample(self, prompts: list[Prompt], settings: SamplingSettings) -> list[Rollout]:
        ids_N = [tuple(ids) for ids in self.renderer.render_all(prompts)]  # each rendered once
        row_of = {ids: d for d, ids in enumerate(dict.fromkeys(ids_N))}
        ids_D = [list(ids) for ids in row_of]
        rows_N = [row_of[ids] for ids in ids_N]
        per_chunk = max(1, self.batch_tokens // (max(map(len, ids_D)) + settings.max_tokens))
        rollouts: list[Rollout] = []
        for start in range(0, len(prompts), per_chunk):
            rollouts += self._sample_chunk(ids_D, rows_N[start : start + per_chunk], settings)
        return rollouts

    def _sample_chunk(
        self, ids_D: list[list[int]], rows_N: list[int], settings: SamplingSettings
    ) -> list[Rollout]:
        """Rollouts for rows_N (indices into the distinct prompts ids_D), each distinct prompt
        of the chunk prefilled once."""
        tok, device = self.policy.tokenizer, self.policy.device
        used = list(dict.fromkeys(rows_N))
        local = {d: i for i, d in enumerate(used)}
        prompt_rows_N = torch.tensor([local[d] for d in rows_N], device=device)
        input_ids_DS, attention_mask_DS = left_pad([ids_D[d] for d in used], tok.pad_token_id)
        eos = eos_ids(self.policy.model, tok)
        with self.policy.inference() as model:
            tokens_NT, logp_NT = decode(
                model,
                input_ids_DS.to(device),
                attention_mask_DS.to(device),
                prompt_rows_N,
                settings,
                sorted(eos),
                tok.pad_token_id,
            )
        tokens, logps = tokens_NT.tolist(), logp_NT.tolist()
        lengths = [_ended_at(row, eos) for row in tokens]
        completions = [row[:n] for row, n in zip(tokens, lengths, strict=True)]
        texts = tok.batch_decode(completions, skip_special_tokens=True)
        return [
            Rollout(ids_D[d], completion, row[:n], completion[-1] in eos, text)
            for d, completion, row, n, text in zip(
                rows_N, completions, logps, lengths, texts, strict=True
            )
        ]


def _ended_at(row: list[int], eos: frozenset[int]) -> int:
    """The completion's length: through its first end-of-sequence token, else the whole row."""
    return next((t + 1 for t, token in enumerate(row) if token in eos), len(row))


# From this vocabulary width on, a token is drawn by inverse CDF (a cumulative sum and a binary
# search): on a CPU torch.multinomial is many times slower over a real model's vocabulary
# (bench/bench_draw.py, BENCHMARKS.md). Narrower vocabularies (the tiny model's 18) keep
# multinomial, whose draws every recorded tiny-model result was made with.
INVERSE_CDF_VOCAB = 1024


def draw(probs_NV: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token a row, drawn with the given probabilities (from `generator`, else torch's
    default one: a packed trial draws from its own, trainer/packed/decode.py)."""
    if probs_NV.shape[-1] < INVERSE_CDF_VOCAB:
        return torch.multinomial(probs_NV, 1, generator=generator)[:, 0]
    cdf_NV = probs_NV.double().cumsum(-1)  # float64: the tail's mass is not rounded away
    target_N1 = torch.rand(
        len(cdf_NV), 1, dtype=cdf_NV.dtype, device=cdf_NV.device, generator=generator
    )
    # right=True: the first token whose cumulative mass exceeds the target, never one of zero
    # probability (a token cut by top-k/top-p adds nothing to the sum)
    token_N = torch.searchsorted(cdf_NV, target_N1 * cdf_NV[:, -1:], right=True)[:, 0]
    return token_N.clamp_max(probs_NV.shape[-1] - 1)  # a target of exactly the total mass


def decode(
    model: torch.nn.Module,
    input_ids_DS: torch.Tensor,
    attention_mask_DS: torch.Tensor,
    prompt_rows_N: torch.Tensor,
    settings: SamplingSettings,
    eos_ids: list[int],
    pad_id: int,
    members: list[tuple[torch.Generator | None, int, int]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample up to max_tokens tokens after left-padded prompts, with a KV cache.

    The D distinct prompts are run once; row n of the output continues prompt prompt_rows_N[n]
    (a group's G rollouts share their prompt's cache instead of recomputing it G times).
    members: (generator, first row, end row) of each packed trial (trainer/packed/decode.py),
    each drawing on its own rows from its own generator until they have all ended, as its
    solo decode would; None: one, every row, torch's default generator.

    Returns the tokens (pad after end-of-sequence) and each token's log-prob under the
    tempered policy, log_softmax(logits / temperature), whatever top_p/top_k/min_p drew it.
    """
    warpers = logits_warpers(settings)
    logits_NV, cache, position_N1, padded = prefill_shared(
        model, input_ids_DS, attention_mask_DS, prompt_rows_N
    )
    make_room(cache, settings.max_tokens - 1)  # the last token drawn is never fed back
    mask_NL = attention_mask_DS[prompt_rows_N]
    seen_NL = input_ids_DS[prompt_rows_N]  # what the repetition penalty looks at
    ended_N = torch.zeros(len(prompt_rows_N), dtype=torch.bool, device=input_ids_DS.device)
    eos_E = torch.tensor(eos_ids, device=input_ids_DS.device)
    drawing = members or [(None, 0, len(prompt_rows_N))]  # those with rows still drawing
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
