"""The policy: a Hugging Face causal LM, LoRA through PEFT, and its log-probabilities.

The same code serves the embedded tiny model and any model directory given by path
(trainer/sampling/model_source.py loads either). With
LoRA the reference policy is the base model with the adapter switched off (no copy); a full
fine-tune keeps a frozen copy, and only when the KL penalty needs it. With LoRA, sampling, the
post-update KL and the learner's forward run on a copy of the model with the adapter folded into
its linear weights (one matmul a layer instead of three; trainer/model/merged_lora.py):
`Policy.inference()` for no-grad work, `Policy.learner()` for the gradient.

What the training step calls (trainer/rl/step.py): `Policy.logprobs` (the reference's or the
current policy's token log-probs, no gradient) and `Policy.learner_pieces` (the learner's
log-probs with their gradient, a micro-batch at a time). The micro-batches' size, packing,
the shared prompt cache and the output layer in chunks stay behind them, here in model/.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import torch
from peft import PeftModel
from transformers import (
    DynamicCache,
    PreTrainedTokenizerBase,
)
from transformers.modeling_layers import GradientCheckpointingLayer

from trainer.model import logprobs, micro_batches, packing
from trainer.model.kv_cache import left_pad, prefill_shared, with_cache
from trainer.model.merged_lora import MergedLoRA
from trainer.model.rollout import Rollout

# PEFT asks transformers a deprecated question on every wrap; nothing for a user to act on.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)


@dataclass
class Policy:
    model: torch.nn.Module  # a PeftModel with LoRA, else the plain model
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    frozen_reference: torch.nn.Module | None = None  # full fine-tune with a KL penalty only
    merge_lora: bool = True  # inference() on merged weights (else on the PEFT model itself)
    # Tokens per learner micro-batch (load_policy sizes it from learner_batch_tokens,
    # trainer/model/micro_batches.py); None: every batch in one piece.
    learner_batch_tokens: int | None = None
    _merged: MergedLoRA | None = field(default=None, init=False, repr=False)
    _trainable: list[torch.nn.Parameter] | None = field(default=None, init=False, repr=False)

    @property
    def uses_lora(self) -> bool:
        return isinstance(self.model, PeftModel)

    @contextlib.contextmanager
    def reference(self) -> Iterator[torch.nn.Module]:
        """The reference policy: the adapter disabled, or the frozen copy."""
        if self.uses_lora:
            with self.model.disable_adapter():
                yield self.model
        else:
            yield self.frozen_reference if self.frozen_reference is not None else self.model

    @contextlib.contextmanager
    def inference(self) -> Iterator[torch.nn.Module]:
        """The current policy in eval mode for no-grad work: the merged copy when LoRA is
        merged (re-merged only when the adapter changed), else the model itself."""
        merged = self._merged_copy()
        if merged is not None:
            yield merged.current()
            return
        was_training = self.model.training
        self.model.eval()
        try:
            yield self.model
        finally:
            self.model.train(was_training)

    @contextlib.contextmanager
    def learner(self) -> Iterator[torch.nn.Module]:
        """The module the learner differentiates, in the model's own train/eval mode: the
        merged copy, whose layers pass the gradient on to the adapter
        (trainer/model/merged_lora.py), when LoRA is merged and plain; else the model itself."""
        merged = self._merged_copy()
        if merged is None or not merged.trainable:
            yield self.model
            return
        model = merged.current()
        merged.set_training(self.model.training)
        try:
            yield model
        finally:
            merged.set_training(False)  # the sampler's mode: no dropout

    def logprobs(
        self, batch: TokenBatch, temperature: float, role: Literal["reference", "inference"]
    ) -> torch.Tensor:
        """Every rollout's token log-probs under the reference policy or the current one (as
        the sampler sees it), no gradient, one micro-batch at a time."""
        models = {"reference": self.reference, "inference": self.inference}
        rows = torch.arange(len(batch.prompt_of_N), device=batch.prompt_of_N.device)
        with torch.no_grad(), models[role]() as model:
            parts = [batch.select(piece) for piece in self.micro_batches(batch, rows)]
            return torch.cat([token_logprobs(model, part, temperature)[0] for part in parts])

    def learner_pieces(
        self, batch: TokenBatch, rows: torch.Tensor, temperature: float
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(piece, logp_NT, entropy_NT) for each micro-batch of the given rollouts: the rows of
        `batch` it holds, their token log-probs with the gradient to the trainable weights, and
        their entropy. A piece's backward belongs before the next: its activations go then."""
        with self.learner() as model:
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

    def _merged_copy(self) -> MergedLoRA | None:
        if not (self.uses_lora and self.merge_lora):
            return None
        if self._merged is None:
            # Plain tensors even when first asked for under inference_mode (the sampler):
            # the copy is re-merged in place under no_grad too, which inference tensors forbid.
            with torch.inference_mode(False):
                self._merged = MergedLoRA(self.model)
        return self._merged

    def weights_changed(self) -> None:
        """Say the weights moved: a fused optimizer writes them without bumping the tensors'
        version counters, so the merged copy cannot see it by itself."""
        if self._merged is not None:
            self._merged.stale = True

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        if self._trainable is None:  # walking the module tree each step is not free: once
            self._trainable = [p for p in self.model.parameters() if p.requires_grad]
        return self._trainable


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Activation checkpointing through transformers: each decoder layer keeps only its input
    for the backward and runs again there. Non-reentrant torch.utils.checkpoint, under which
    the merged copy's custom backward works as it is. A checkpointed layer may keep the
    learner's prompt cache (transformers drops any other), since a PromptCache is never
    written: the layer run again reads the same keys and values."""
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    for module in model.modules():
        if isinstance(module, GradientCheckpointingLayer):
            module._can_checkpoint_with_cache = True


@contextlib.contextmanager
def prefill_unchecked(model: torch.nn.Module) -> Iterator[None]:
    """Checkpointing off for the shared prompts' prefill: it writes its cache, which a layer run
    again in the backward would write twice. Its activations are the prompts', once each."""
    layers = [
        m
        for m in model.modules()
        if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing
    ]
    for layer in layers:
        layer.gradient_checkpointing = False
    try:
        yield
    finally:
        for layer in layers:
            layer.gradient_checkpointing = True


class PromptCache(DynamicCache):
    """The shared prompts' keys and values, read and never extended: each layer attends over
    them and the completions' own. A DynamicCache would append the completions' keys, twice
    when a checkpointed layer runs again in the backward."""

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        layer = self.layers[layer_idx]
        return torch.cat([layer.keys, key_states], -2), torch.cat([layer.values, value_states], -2)


def prompt_cache(cache: DynamicCache) -> PromptCache:
    read_only = PromptCache()
    read_only.layers = cache.layers
    return read_only


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


def right_pad(row: list, width: int, value: float) -> list:
    return [*row, *[value] * (width - len(row))]


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
