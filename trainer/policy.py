"""The policy: a Hugging Face causal LM, LoRA through PEFT, and its log-probabilities.

The same code serves the embedded tiny model and any model directory given by path. With
LoRA the reference policy is the base model with the adapter switched off (no copy); a full
fine-tune keeps a frozen copy, and only when the KL penalty needs it.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from omegaconf import DictConfig
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from trainer.rl_math import token_entropy
from trainer.sampling import Rollout
from trainer.tiny_model import build_tiny_model

# PEFT asks transformers a deprecated question on every wrap; nothing for a user to act on.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


@dataclass
class Policy:
    model: torch.nn.Module  # a PeftModel with LoRA, else the plain model
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    frozen_reference: torch.nn.Module | None = None  # full fine-tune with a KL penalty only

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

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]


def load_policy(cfg: DictConfig) -> Policy:
    path = cfg.model.path or str(build_tiny_model(cfg.model.tiny))
    device = resolve_device(cfg.model.device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, cfg.model.dtype))
    model.to(device)
    frozen_reference = None
    if cfg.lora_rank > 0:
        targets = list(cfg.lora_target_modules)
        lora = LoraConfig(
            r=cfg.lora_rank,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=cfg.lora_dropout,
            target_modules="all-linear" if targets == ["all-linear"] else targets,
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lora)
    elif cfg.kl_penalty_coef > 0:
        frozen_reference = copy.deepcopy(model).eval().requires_grad_(False)
    return Policy(model, tokenizer, device, frozen_reference)


@dataclass(frozen=True)
class TokenBatch:
    """Rollouts as right-padded tensors; per-token tensors are aligned to predicted tokens.

    Position t of a `_NT` tensor is the prediction of token t+1 of `input_ids_NL`.
    """

    input_ids_NL: torch.Tensor
    attention_mask_NL: torch.Tensor
    targets_NT: torch.Tensor
    mask_NT: torch.Tensor  # 1 on completion tokens
    sampler_logp_NT: torch.Tensor
    finished_N: torch.Tensor  # 1.0 where the completion ended with end-of-sequence

    def to(self, device: torch.device) -> TokenBatch:
        return TokenBatch(*(t.to(device) for t in self.__dict__.values()))

    def select(self, rows: torch.Tensor) -> TokenBatch:
        return TokenBatch(*(t[rows] for t in self.__dict__.values()))


def collate(rollouts: list[Rollout], pad_id: int) -> TokenBatch:
    length = max(len(r.prompt_ids) + len(r.completion_ids) for r in rollouts)
    n = len(rollouts)
    ids = torch.full((n, length), pad_id, dtype=torch.long)
    attention = torch.zeros((n, length), dtype=torch.long)
    mask = torch.zeros((n, length - 1))
    sampler_logp = torch.zeros((n, length - 1))
    for i, r in enumerate(rollouts):
        p, c = len(r.prompt_ids), len(r.completion_ids)
        ids[i, : p + c] = torch.tensor(r.prompt_ids + r.completion_ids)
        attention[i, : p + c] = 1
        mask[i, p - 1 : p - 1 + c] = 1  # position p-1 predicts the first completion token
        sampler_logp[i, p - 1 : p - 1 + c] = torch.tensor(r.sampler_logps)
    finished = torch.tensor([float(r.finished) for r in rollouts])
    return TokenBatch(ids, attention, ids[:, 1:], mask, sampler_logp, finished)


def token_logprobs(
    model: torch.nn.Module, batch: TokenBatch, temperature: float, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the batch's tokens under the model's tempered distribution (and entropy)."""
    logits_NLV = model(input_ids=batch.input_ids_NL, attention_mask=batch.attention_mask_NL).logits
    logits_NTV = logits_NLV[:, :-1].float() / temperature
    logp_NT = torch.log_softmax(logits_NTV, dim=-1).gather(-1, batch.targets_NT[..., None])[..., 0]
    entropy_NT = token_entropy(logits_NTV.detach()) if with_entropy else None
    return logp_NT, entropy_NT
