"""Where the policy comes from: the model directory given by `model.path`, else the embedded
tiny model, built and cached on first use.

Above the policy and the samplers, not inside trainer/model/policy.py: building the tiny model
samples from it (trainer/sampling/tiny_model.py probes with the torch sampler).
"""

from __future__ import annotations

import copy

import torch
from omegaconf import DictConfig
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer.model import cpu_linear, micro_batches
from trainer.model.activation_checkpointing import enable_checkpointing
from trainer.model.fast_logprobs import FastPasses
from trainer.model.policy import Policy
from trainer.sampling.tiny_model import build_tiny_model


def model_path(cfg: DictConfig) -> str:
    """The directory the policy (and vLLM's engine) loads: model.path, else the tiny model."""
    return cfg.model.path or str(build_tiny_model(cfg.model.tiny))


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def load_policy(cfg: DictConfig) -> Policy:
    path = model_path(cfg)
    device = resolve_device(cfg.model.device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, cfg.model.dtype))
    model.to(device)
    if cfg.gradient_checkpointing:
        enable_checkpointing(model)
    frozen_reference = None
    lora = lora_config(cfg)
    if lora is not None:
        model = get_peft_model(model, lora)
    elif cfg.kl_penalty_coef > 0:
        frozen_reference = copy.deepcopy(model).eval().requires_grad_(False)
    learner_batch_tokens = micro_batches.model_token_budget(
        cfg.learner_batch_tokens,
        model.config,
        getattr(torch, cfg.model.dtype),
        cfg.gradient_checkpointing,
    )
    passes = FastPasses(learner_batch_tokens)
    return Policy(model, tokenizer, device, frozen_reference, cfg.sampler.merge_lora, passes)


def onednn_param(cfg: DictConfig) -> str:
    """on | off: whether our trainer computes this model's float32 linear layers in oneDNN on
    this host (trainer/model/cpu_linear.py's choice, read from the checkpoint's shapes, the
    same shapes the policy's merged copy is decided by); off a CPU or below float32."""
    on_cpu = resolve_device(cfg.model.device).type == "cpu" and cfg.model.dtype == "float32"
    return "on" if on_cpu and cpu_linear.checkpoint_choice(model_path(cfg))[0] else "off"


def lora_config(cfg: DictConfig) -> LoraConfig | None:
    """The run's LoRA adapter (None: lora_rank=0 trains every weight); TRL's backend too."""
    if cfg.lora_rank == 0:
        return None
    targets = list(cfg.lora_target_modules)
    return LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules="all-linear" if targets == ["all-linear"] else targets,
        task_type="CAUSAL_LM",
    )
