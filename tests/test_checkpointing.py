"""gradient_checkpointing=true: the same gradients, on the learner's merged copy (its custom
backward) and through the shared prompt cache, which transformers' checkpointing would drop."""

import pytest
import torch
from conftest import compose_conf

from trainer.model import packing
from trainer.model.policy import collate, token_logprobs
from trainer.sampling.model_source import load_policy
from trainer.sampling.protocol import SamplingSettings
from trainer.sampling.torch_sampler import TorchSampler

PROMPTS = ["12+34=", "7+45=", "99+1="]


def float64_policy(checkpointing: bool):
    torch.manual_seed(0)  # the same LoRA initialisation in both
    cfg = compose_conf("output_dir=/tmp/unused", f"gradient_checkpointing={checkpointing}")
    policy = load_policy(cfg)
    policy.model.double()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # LoRA B starts at zero, which would hide a wrong adapter gradient
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return policy


@pytest.mark.parametrize("path", ["packed", "shared-cache"])
def test_checkpointing_gives_the_same_log_probs_and_gradients(monkeypatch, path):
    monkeypatch.setattr(packing, "MAX_ROW_TOKENS", 10_000 if path == "packed" else 0)
    plain, checkpointed = float64_policy(False), float64_policy(True)
    rollouts = TorchSampler(plain).sample(
        [p for p in PROMPTS for _ in range(3)], SamplingSettings()
    )
    batch = collate(rollouts, plain.tokenizer.pad_token_id)
    results = []
    for policy in (plain, checkpointed):
        with policy.learner() as model:
            logp_NT, _ = token_logprobs(model, batch, 1.0)
        logp_NT.mul(batch.mask_NT).sum().backward()
        results.append((logp_NT.detach(), [p.grad for p in policy.trainable_parameters()]))
    (plain_NT, plain_grads), (checkpointed_NT, checkpointed_grads) = results
    assert checkpointed.model.get_base_model().model.layers[0].gradient_checkpointing
    assert torch.allclose(checkpointed_NT, plain_NT, rtol=0, atol=1e-12)
    for c, p in zip(checkpointed_grads, plain_grads, strict=True):
        assert torch.allclose(c, p, rtol=1e-9, atol=1e-12)
    assert any(g.abs().max() > 0 for g in plain_grads)
