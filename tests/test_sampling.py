"""The torch sampler: LoRA merged for sampling, a lean KV-cached loop, and log-probs that stay
the learner's on-policy (kl_sample_train ~ 0), whatever the speed-ups."""

import pytest
import torch

from trainer import metrics, rl_math
from trainer.policy import collate, load_policy, token_logprobs
from trainer.sampling import SamplingSettings, TorchSampler
from trainer.step import optimizer_step

PROMPTS = ["12+34=", "7+45=", "99+1=", "3+3="]


def moved_adapter(policy, seed: int = 0) -> None:
    """A trained-looking adapter: LoRA B starts at zero, which would hide a wrong merge."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))


def learner_kl(policy, rollouts, temperature: float = 1.0) -> float:
    batch = collate(rollouts, policy.tokenizer.pad_token_id)
    with torch.no_grad():
        learner_NT, _ = token_logprobs(policy.model, batch, temperature)
    return rl_math.kl_sample_train(batch.sampler_logp_NT, learner_NT, batch.mask_NT)[1]


def test_the_merged_copy_gives_the_peft_models_log_probs_and_follows_updates(composed):
    policy = load_policy(composed())
    base_before = {n: p.clone() for n, p in policy.model.named_parameters() if not p.requires_grad}
    rollouts = TorchSampler(policy).sample(PROMPTS * 4, SamplingSettings())
    batch = collate(rollouts, policy.tokenizer.pad_token_id)
    for seed in (0, 1):  # the second change must be picked up too: no stale merge
        moved_adapter(policy, seed)
        with torch.no_grad():
            peft_NT, _ = token_logprobs(policy.model, batch, 1.0)
            with policy.inference() as merged:
                merged_NT, _ = token_logprobs(merged, batch, 1.0)
        assert merged is not policy.model
        mask = batch.mask_NT.bool()
        assert (merged_NT - peft_NT)[mask].abs().max() < 1e-4  # float rounding of a sum
    # The merge is out of place: the base weights (the reference policy) are bit for bit intact.
    for name, param in policy.model.named_parameters():
        if not param.requires_grad:
            assert torch.equal(param, base_before[name]), name


@pytest.mark.parametrize(
    ("merge_lora", "settings"),
    [
        (True, SamplingSettings()),
        (False, SamplingSettings()),
        (True, SamplingSettings(temperature=0.7, top_k=5, top_p=0.9, repetition_penalty=1.2)),
    ],
    ids=["merged", "peft", "merged+warpers"],
)
def test_sampler_log_probs_are_the_learners_on_policy(composed, merge_lora, settings):
    policy = load_policy(composed(f"sampler.merge_lora={merge_lora}"))
    moved_adapter(policy)
    torch.manual_seed(0)
    rollouts = TorchSampler(policy).sample(PROMPTS * 8, settings)
    assert learner_kl(policy, rollouts, settings.temperature) < 1e-9
    assert all(len(r.completion_ids) == len(r.sampler_logps) >= 1 for r in rollouts)


def test_completions_stop_at_end_of_sequence_or_max_tokens(composed):
    policy = load_policy(composed())
    eos = policy.tokenizer.eos_token_id
    torch.manual_seed(0)
    rollouts = TorchSampler(policy).sample(PROMPTS * 16, SamplingSettings(max_tokens=5))
    for r in rollouts:
        assert r.finished == (r.completion_ids[-1] == eos)
        assert eos not in r.completion_ids[:-1]  # nothing after the end
        assert r.finished or len(r.completion_ids) == 5
    assert any(r.finished for r in rollouts)
    assert rollouts[0].prompt_ids == policy.tokenizer(PROMPTS[0]).input_ids


def test_shared_prompts_and_small_batches_sample_the_same(composed):
    # Greedy: the rows of one prompt share its cache, and any chunking gives the same tokens.
    policy = load_policy(composed())
    moved_adapter(policy)
    greedy = SamplingSettings(greedy=True)
    prompts = [p for p in PROMPTS for _ in range(3)]
    whole = TorchSampler(policy).sample(prompts, greedy)
    one_at_a_time = TorchSampler(policy, batch_tokens=1).sample(prompts, greedy)
    alone = [TorchSampler(policy).sample([p], greedy)[0] for p in PROMPTS]
    assert [r.completion_ids for r in whole] == [r.completion_ids for r in one_at_a_time]
    assert [r.completion_ids for r in whole[::3]] == [r.completion_ids for r in alone]
    for a, b in zip(whole, one_at_a_time, strict=True):
        assert a.sampler_logps == pytest.approx(b.sampler_logps, abs=1e-5)


def test_a_fused_optimizer_step_reaches_the_sampler(composed):
    # A fused AdamW writes the weights without bumping their version counters: the step itself
    # must tell the merged copy, or sampling would silently stay on the old policy.
    cfg = composed()
    policy = load_policy(cfg)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=0.05, fused=True)
    rollouts = TorchSampler(policy).sample(PROMPTS * 4, SamplingSettings())
    batch = collate(rollouts, policy.tokenizer.pad_token_id)
    with torch.no_grad(), policy.inference() as merged:
        before_NT, _ = token_logprobs(merged, batch, 1.0)
    learner_NT, _ = token_logprobs(policy.model, batch, 1.0)
    loss = -(learner_NT * batch.mask_NT).sum()
    loss.backward()
    optimizer_step(cfg, policy, optimizer, {metrics.LOSS: loss.item()})
    with torch.no_grad():
        peft_NT, _ = token_logprobs(policy.model, batch, 1.0)
        with policy.inference() as merged:
            after_NT, _ = token_logprobs(merged, batch, 1.0)
    mask = batch.mask_NT.bool()
    assert (after_NT - before_NT)[mask].abs().max() > 1e-3  # the step moved the policy
    assert (after_NT - peft_NT)[mask].abs().max() < 1e-4  # and the sampler follows it
