"""The policy and what the training step (trainer/rl/step.py) asks of it, in plain words.

The policy is a Hugging Face causal LM, with LoRA through PEFT or fully fine-tuned; the same
code serves the embedded tiny model and any model directory given by path
(trainer/sampling/model_source.py loads either). The step hands it rollouts as a `TokenBatch`
(trainer/model/token_batch.py: `collate`) and calls:

  logprobs         for every rollout, the log-probability of each completion token given the
                   prompt and the completion's earlier tokens, under the model's distribution
                   divided by the temperature: the reference policy's (the base model: LoRA's
                   adapter off, or a frozen copy) or the current one's as the sampler sees it.
                   No gradient. N x T, aligned to the completion tokens (mask_NT says which
                   are real).
  learner_pieces   the same log-probs for the given rollouts under the weights being trained,
                   with their gradient, and each position's entropy, in pieces of consecutive
                   rollouts (micro-batches). A piece's backward belongs before the next piece
                   is asked for: its activations go then.

With LoRA the reference is the base model with the adapter switched off (no copy); a full
fine-tune keeps a frozen copy, and only when the KL penalty needs it. With LoRA, sampling, the
post-update KL and the learner's forward run on a copy of the model with the adapter folded into
its linear weights (one matmul a layer instead of three; trainer/model/merged_lora.py):
`Policy.inference()` for no-grad work, `Policy.learner()` for the gradient.

How the passes run is a `LogprobPasses`: by default `FastPasses` (trainer/model/fast_logprobs.py:
micro-batches sized to memory, each prompt once for its group, the output layer in chunks);
`PlainPasses` (trainer/model/plain_logprobs.py) computes the same numbers with one plain
forward, and tests/test_plain_logprobs.py holds the two equal. The step reads neither.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch
from peft import PeftModel
from transformers import PreTrainedTokenizerBase

from trainer.model.fast_logprobs import FastPasses
from trainer.model.merged_lora import MergedLoRA
from trainer.model.token_batch import TokenBatch

# PEFT asks transformers a deprecated question on every wrap; nothing for a user to act on.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)


class LogprobPasses(Protocol):
    """How the log-prob passes run over a TokenBatch, on the model the Policy picked."""

    learner_batch_tokens: int | None  # the most tokens a learner piece holds; None: no bound

    def logprobs(
        self, model: torch.nn.Module, batch: TokenBatch, temperature: float
    ) -> torch.Tensor:
        """Every rollout's token log-probs, N x T."""
        ...

    def learner_pieces(
        self, model: torch.nn.Module, batch: TokenBatch, rows: torch.Tensor, temperature: float
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(piece, logp_NT, entropy_NT) for each piece of the given rollouts, in their order."""
        ...


@dataclass
class Policy:
    model: torch.nn.Module  # a PeftModel with LoRA, else the plain model
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    frozen_reference: torch.nn.Module | None = None  # full fine-tune with a KL penalty only
    merge_lora: bool = True  # inference() on merged weights (else on the PEFT model itself)
    # How logprobs and learner_pieces run (load_policy sizes FastPasses' micro-batches).
    passes: LogprobPasses = field(default_factory=FastPasses)
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
        the sampler sees it), no gradient."""
        models = {"reference": self.reference, "inference": self.inference}
        with torch.no_grad(), models[role]() as model:
            return self.passes.logprobs(model, batch, temperature)

    def learner_pieces(
        self, batch: TokenBatch, rows: torch.Tensor, temperature: float
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(piece, logp_NT, entropy_NT) for each micro-batch of the given rollouts: the rows of
        `batch` it holds, their token log-probs with the gradient to the trainable weights, and
        their entropy. A piece's backward belongs before the next: its activations go then."""
        with self.learner() as model:
            yield from self.passes.learner_pieces(model, batch, rows, temperature)

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
