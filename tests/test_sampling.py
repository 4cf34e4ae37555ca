"""The torch sampler: a lean KV-cached loop, its draw, and log-probs that stay the learner's
on-policy (kl_sample_train ~ 0), whatever the speed-ups. The merged LoRA it samples with is
tested in tests/test_merged_lora.py."""

import pytest
import torch
from conftest import PROMPTS, learner_kl, moved_adapter
from transformers.cache_utils import DynamicLayer

from records import metrics
from trainer.model import packing
from trainer.model.fast_logprobs import token_logprobs
from trainer.model.kv_cache import PreallocatedLayer
from trainer.model.rollout import Rollout
from trainer.model.token_batch import collate
from trainer.rl.step import optimizer_step
from trainer.sampling import torch_sampler
from trainer.sampling.model_source import load_policy
from trainer.sampling.protocol import SamplingSettings
from trainer.sampling.torch_sampler import INVERSE_CDF_VOCAB, TorchSampler, draw


def test_collate_pads_prompts_left_and_completions_right_each_prompt_once():
    rollouts = [
        Rollout([1, 5], [7, 2], [-0.5, -0.25], True, ""),
        Rollout([1, 6, 6], [8], [-1.0], False, ""),
        Rollout([1, 5], [9, 9, 2], [-0.125, -2.0, -0.75], True, ""),
    ]
    batch = collate(rollouts, pad_id=0)
    assert batch.prompt_ids_DS.tolist() == [[0, 1, 5], [1, 6, 6]]
    assert batch.prompt_mask_DS.tolist() == [[0, 1, 1], [1, 1, 1]]
    assert batch.prompt_of_N.tolist() == [0, 1, 0]
    assert batch.completion_ids_NT.tolist() == [[7, 2, 0], [8, 0, 0], [9, 9, 2]]
    assert batch.mask_NT.tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1]]
    assert batch.sampler_logp_NT.tolist() == [[-0.5, -0.25, 0], [-1, 0, 0], [-0.125, -2, -0.75]]
    assert batch.finished_N.tolist() == [1, 0, 1]
    assert batch.completion_ids_NT.dtype == batch.prompt_ids_DS.dtype == torch.long
    assert batch.mask_NT.dtype == batch.sampler_logp_NT.dtype == torch.float32


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


def test_a_wide_vocabulary_draws_each_token_with_its_probability_and_never_a_cut_one():
    """The inverse-CDF draw (vocabularies of INVERSE_CDF_VOCAB tokens or more): frequencies
    within 5 standard errors of the probabilities, and a zero-probability token (cut by top-k or
    top-p) never drawn, wherever it sits."""
    torch.manual_seed(0)
    vocab, rows = INVERSE_CDF_VOCAB + 3, 200_000
    probs_V = torch.zeros(vocab)
    probs_V[[0, 7, vocab // 2, vocab - 2]] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    counts_V = torch.bincount(draw(probs_V.expand(rows, -1)), minlength=vocab).double()
    assert counts_V.sum() == rows
    assert counts_V[probs_V == 0].sum() == 0
    expected_V = probs_V.double() * rows
    stderr_V = (probs_V.double() * (1 - probs_V.double()) * rows).sqrt()
    kept = probs_V > 0
    assert ((counts_V[kept] - expected_V[kept]).abs() < 5 * stderr_V[kept]).all()
    # unnormalised rows (what a softmax gives, up to rounding) draw the same way
    assert draw(torch.tensor([[0.0] * (vocab - 1) + [2.5]])).item() == vocab - 1


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


def test_decoding_into_a_preallocated_cache_draws_what_the_growing_one_draws(composed, monkeypatch):
    # make_room's in-place buffers against transformers' cat-per-token cache: the same draws
    # and log-probs bit for bit, with padded prompts of unequal lengths.
    policy = load_policy(composed())
    moved_adapter(policy)
    prompts = [p for p in [*PROMPTS, PROMPTS[0] * 3] for _ in range(2)]
    settings = SamplingSettings(max_tokens=12)
    runs = []
    for room in (torch_sampler.make_room, lambda cache, room: None):
        monkeypatch.setattr(torch_sampler, "make_room", room)
        torch.manual_seed(0)
        runs.append(TorchSampler(policy).sample(prompts, settings))
    preallocated, growing = runs
    assert [r.completion_ids for r in preallocated] == [r.completion_ids for r in growing]
    assert [r.sampler_logps for r in preallocated] == [r.sampler_logps for r in growing]
    assert max(len(r.completion_ids) for r in growing) > 2  # it decoded past the first tokens


def test_a_preallocated_cache_refuses_more_positions_than_it_has_room_for():
    layer = DynamicLayer()
    layer.update(torch.zeros(2, 1, 3, 4), torch.zeros(2, 1, 3, 4))
    full = PreallocatedLayer(layer, room=1)
    keys, _ = full.update(torch.ones(2, 1, 1, 4), torch.ones(2, 1, 1, 4))
    assert keys.shape == (2, 1, 4, 4) and keys[:, :, 3].eq(1).all()
    with pytest.raises(RuntimeError, match="the cache holds 4 positions, not 5"):
        full.update(torch.ones(2, 1, 1, 4), torch.ones(2, 1, 1, 4))
    with pytest.raises(NotImplementedError, match="only appends"):  # would leave its buffer
        full.batch_select_indices(torch.tensor([0]))


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
    torch.manual_seed(0)  # LoRA's initialisation draws from it too
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
    assert (after_NT - peft_NT)[mask].abs().max() < 5e-4  # and the sampler follows it


def full_row_logprobs(model, rollouts) -> list[torch.Tensor]:
    """The plain way: each rollout's prompt and completion in one forward of its own."""
    out = []
    for r in rollouts:
        ids = torch.tensor([r.prompt_ids + r.completion_ids])
        logp_LV = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), dim=-1)
        targets = ids[0, len(r.prompt_ids) :]
        out.append(logp_LV[len(r.prompt_ids) - 1 :].gather(-1, targets[:, None])[:, 0])
    return out


@pytest.mark.parametrize("path", ["packed", "shared-cache"])
def test_each_prompt_runs_once_with_the_same_log_probs_and_gradients(composed, monkeypatch, path):
    # The learner runs a group's prompt once: packed into one row with the group's rollouts,
    # or with its keys and values shared with them. In float64 either must give full rows'
    # log-probs and gradients, prompts of different lengths (left padding) and a minibatch of
    # a subset of the groups included.
    monkeypatch.setattr(packing, "MAX_ROW_TOKENS", 10_000 if path == "packed" else 0)
    # transformers computes RMSNorm in float32 even in a float64 model, so the two agree to
    # float32's rounding (seen: 6e-7 of the gradient's norm; 1e-12 with RMSNorm in float64).
    torch.manual_seed(0)
    policy = load_policy(composed())
    moved_adapter(policy)
    rollouts = TorchSampler(policy).sample(
        [p for p in PROMPTS for _ in range(3)], SamplingSettings()
    )
    policy.model.double()
    batch = collate(rollouts, policy.tokenizer.pad_token_id)
    assert batch.prompt_ids_DS.shape[0] == len(PROMPTS)
    rows = torch.tensor([3, 4, 5, 9, 10, 11])  # the groups of PROMPTS[1] and PROMPTS[3]
    minibatch = batch.select(rows)
    assert minibatch.prompt_ids_DS.shape == (2, max(len(rollouts[i].prompt_ids) for i in rows))
    shared_NT, _ = token_logprobs(policy.model, minibatch, 1.0)
    shared_NT.mul(minibatch.mask_NT).sum().backward()
    shared_grads = [p.grad.clone() for p in policy.trainable_parameters()]
    policy.model.zero_grad()
    full = full_row_logprobs(policy.model, [rollouts[i] for i in rows])
    sum(f.sum() for f in full).backward()
    for n, f in enumerate(full):
        assert torch.allclose(shared_NT[n, : len(f)], f, rtol=1e-5, atol=1e-8)
    for shared, p in zip(shared_grads, policy.trainable_parameters(), strict=True):
        assert (shared - p.grad).norm() <= 1e-5 * p.grad.norm()
    assert any(g.abs().sum() > 0 for g in shared_grads)
