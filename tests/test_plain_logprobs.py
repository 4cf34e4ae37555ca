"""The fast log-probs equal the plain ones: `Policy.logprobs` (the reference and the current
policy) and `Policy.learner_pieces` against one ordinary forward over the whole padded batch
(trainer/model/plain_logprobs.py), in one micro-batch and in several, packed and through the
shared prompt cache, the output layer whole and in chunks; and the step's update on the
policy's fast passes against the same update on its plain ones."""

import pytest
import torch
from conftest import compose_conf, moved_adapter

from trainer.model import logprobs, packing
from trainer.model.fast_logprobs import FastPasses
from trainer.model.plain_logprobs import PlainPasses, plain_token_logprobs
from trainer.model.token_batch import collate
from trainer.rl.step import Prepared, backward
from trainer.sampling.model_source import load_policy
from trainer.sampling.protocol import SamplingSettings
from trainer.sampling.torch_sampler import TorchSampler

PROMPTS = ["12+34=", "7+45=", "99+1=", "3+3=", "50+50="]  # unequal lengths: left padding
GROUP = 4
TEMPERATURE = 0.7  # not 1: the tempering is compared too
# The fast paths sum attention and the matmuls in another order (packed rows, cached prompts,
# other shapes), so float32 log-probs differ by rounding, which grows with the numbers rounded:
# a log-prob is a tempered logit minus a log-sum-exp, one of them at least |logp|/2. Measured
# against float64 (8 seeds, every path and role, AVX-512 or AVX2 kernels): either path is off
# by up to 2e-5 |logp| (170 float32 eps: 1.5e-4 at logp -16), fast against plain by at most
# 1.1e-5 |logp|, or 1.8e-5 where |logp| < 1. An algorithmic slip is far outside: a temperature
# off by 1.4e-4 of itself moves them by 2e-3, attended pads by up to 19.
# In float64 only rounding is left: 1e-10 holds the algorithm exact.
LOGPROB_TOLERANCE = {"float32": dict(rtol=2e-5, atol=2e-5), "float64": dict(rtol=0, atol=1e-10)}
ENTROPY_TOLERANCE = 2e-5  # a statistic: the one-chunk path sums it in float32 whatever the dtype
# Of the largest gradient: a backward through other shapes sums in another order too.
GRADIENT_TOLERANCE = {"float32": 1e-4, "float64": 1e-6}


@pytest.fixture(scope="module", params=["float32", "float64"])
def sampled(request):
    """A tiny policy of the given dtype with a moved adapter (so the reference, adapter off,
    differs from the policy), and GROUP rollouts of each prompt from it, collated."""
    torch.manual_seed(0)
    cfg = compose_conf("output_dir=/tmp/unused", "max_tokens=12", f"model.dtype={request.param}")
    policy = load_policy(cfg)
    moved_adapter(policy)
    settings = SamplingSettings(max_tokens=12, temperature=TEMPERATURE)
    rollouts = TorchSampler(policy).sample([p for p in PROMPTS for _ in range(GROUP)], settings)
    return request.param, policy, collate(rollouts, policy.tokenizer.pad_token_id)


@pytest.mark.parametrize("path", ["packed", "shared-cache"])
@pytest.mark.parametrize("pieces", ["one", "several"])
def test_the_fast_log_probs_equal_one_plain_forward(sampled, monkeypatch, path, pieces):
    dtype, policy, batch = sampled
    monkeypatch.setattr(packing, "MAX_ROW_TOKENS", 10_000 if path == "packed" else 0)
    rows = torch.arange(len(batch.prompt_of_N))
    if pieces == "several":  # about three rollouts a piece, the output layer 5 positions a chunk
        width = batch.completion_ids_NT.shape[1]
        monkeypatch.setattr(policy.passes, "learner_batch_tokens", 3 * width + 4)
        monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 5 * policy.tokenizer.vocab_size)
        assert len(policy.passes.micro_batches(batch, rows)) >= 3
    else:  # the default size: the whole batch in one piece
        assert len(policy.passes.micro_batches(batch, rows)) == 1
    mask = batch.mask_NT.bool()
    tolerance = LOGPROB_TOLERANCE[dtype]

    for role, model_of in (("reference", policy.reference), ("inference", policy.inference)):
        with torch.no_grad(), model_of() as model:
            plain_NT, _ = plain_token_logprobs(model, batch, TEMPERATURE)
        fast_NT = policy.logprobs(batch, TEMPERATURE, role)
        torch.testing.assert_close(fast_NT[mask], plain_NT[mask], **tolerance)

    learned = list(policy.learner_pieces(batch, rows, TEMPERATURE))
    with torch.no_grad(), policy.learner() as model:
        plain_NT, plain_entropy_NT = plain_token_logprobs(model, batch, TEMPERATURE)
    assert torch.cat([piece for piece, _, _ in learned]).tolist() == rows.tolist()
    assert all(logp_NT.requires_grad for _, logp_NT, _ in learned)  # the learner's gradient
    learner_NT = torch.cat([logp_NT for _, logp_NT, _ in learned]).detach()
    torch.testing.assert_close(learner_NT[mask], plain_NT[mask], **tolerance)
    entropy_NT = torch.cat([entropy_NT for _, _, entropy_NT in learned])
    torch.testing.assert_close(
        entropy_NT[mask].double(), plain_entropy_NT[mask].double(), rtol=0, atol=ENTROPY_TOLERANCE
    )


def test_the_reference_differs_from_the_policy(sampled):
    """Else comparing both roles above would check one of them twice."""
    _, policy, batch = sampled
    mask = batch.mask_NT.bool()
    reference_NT = policy.logprobs(batch, TEMPERATURE, "reference")[mask]
    assert (
        reference_NT - policy.logprobs(batch, TEMPERATURE, "inference")[mask]
    ).abs().max() > 1e-3


@pytest.mark.parametrize("pieces", ["one", "several"])
def test_the_steps_update_on_the_plain_passes_equals_the_fast_ones(sampled, monkeypatch, pieces):
    """The step reads the policy through its contract only: swapping the passes behind it
    (FastPasses for PlainPasses) leaves the loss, its statistics and the gradients as they were."""
    dtype, policy, batch = sampled
    cfg = compose_conf("output_dir=/tmp/unused", "max_tokens=12", f"temperature={TEMPERATURE}")
    rows = torch.arange(len(batch.prompt_of_N))
    advantages_NT = torch.linspace(-1, 1, len(rows), dtype=torch.float64)[:, None] * batch.mask_NT
    prepared = Prepared(batch, advantages_NT, batch.mask_NT, None, {})
    width = batch.completion_ids_NT.shape[1]
    budget = 3 * width + 4 if pieces == "several" else None

    def update(passes):
        monkeypatch.setattr(policy, "passes", passes)
        for p in policy.trainable_parameters():
            p.grad = None
        metrics = backward(cfg, policy, prepared, rows)
        grads = [p.grad.clone() for p in policy.trainable_parameters()]
        for p in policy.trainable_parameters():
            p.grad = None
        return metrics, grads

    fast, fast_grads = update(FastPasses(budget))
    plain, plain_grads = update(PlainPasses())
    for name in ("loss", "kl_sample_train_v1", "kl_sample_train_v2"):
        got, want = (torch.tensor(m[name], dtype=torch.float64) for m in (fast, plain))
        torch.testing.assert_close(got, want, **LOGPROB_TOLERANCE[dtype], msg=name)
    assert abs(fast["entropy"] - plain["entropy"]) <= ENTROPY_TOLERANCE
    assert any(g.abs().max() > 0 for g in plain_grads)
    for f, g in zip(fast_grads, plain_grads, strict=True):
        torch.testing.assert_close(f, g, rtol=0, atol=GRADIENT_TOLERANCE[dtype] * g.abs().max())
