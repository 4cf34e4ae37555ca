"""vLLM sampling on a GPU (`pip install .[vllm]`): skipped without CUDA and vllm. Its
per-token log-probs must match the learner's on the same tokens (the sampler-vs-learner
mismatch the seeds warn about stays far under 0.01), and the adapter follows each update."""

from __future__ import annotations

import time

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_vllm_log_probs_match_the_learner_and_follow_the_adapter(composed):
    pytest.importorskip("vllm")
    from trainer.model.fast_logprobs import token_logprobs
    from trainer.model.token_batch import collate
    from trainer.rl import rl_math
    from trainer.sampling.model_source import load_policy
    from trainer.sampling.protocol import SamplingSettings
    from trainer.sampling.torch_sampler import TorchSampler
    from trainer.sampling.vllm_sampler import VLLMSampler

    cfg = composed("sampler=vllm", "model.device=cuda")
    policy = load_policy(cfg)
    sampler = VLLMSampler(policy, cfg)
    settings = SamplingSettings.from_config(cfg)
    prompts = ["12+34=", "07+45=", "99+01="] * 64
    started = time.perf_counter()
    rollouts = sampler.sample(prompts, settings)
    vllm_s = time.perf_counter() - started
    batch = collate(rollouts, policy.tokenizer.pad_token_id).to(policy.device)
    with torch.no_grad():
        learner_NT, _ = token_logprobs(policy.model, batch, cfg.temperature)
    _, kl_v2 = rl_math.kl_sample_train(batch.sampler_logp_NT, learner_NT, batch.mask_NT)
    assert kl_v2 < 1e-3, kl_v2
    started = time.perf_counter()
    TorchSampler(policy).sample(prompts, settings)
    torch_s = time.perf_counter() - started
    print(f"vLLM {len(prompts) / vllm_s:.0f} vs torch {len(prompts) / torch_s:.0f} rollouts/s")
    greedy = SamplingSettings(max_tokens=8, greedy=True)
    before = [r.completion_ids for r in sampler.sample(prompts[:3], greedy)]
    with torch.no_grad():  # a changed adapter must change what vLLM samples from
        for p in policy.trainable_parameters():
            p.add_(0.5 * torch.randn_like(p))
    sampler.sync_weights()
    after = [r.completion_ids for r in sampler.sample(prompts[:3], greedy)]
    assert after != before
