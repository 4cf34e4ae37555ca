"""The learner in micro-batches: the same gradients as the whole minibatch, for every loss.

Float64, the real learner (the merged copy's custom backward, packing or the shared prompt
cache, the KL reference forward), the output layer in chunks: only the pieces differ.
"""

import pytest
import torch

from trainer.model import logprobs, micro_batches, packing
from trainer.model.fast_logprobs import token_logprobs
from trainer.model.micro_batches import split_rows
from trainer.model.token_batch import collate
from trainer.rl.losses import LOSSES
from trainer.rl.rl_math import minibatch_rows
from trainer.rl.step import Groups, backward, prepare
from trainer.sampling.model_source import load_policy
from trainer.sampling.protocol import SamplingSettings
from trainer.sampling.torch_sampler import TorchSampler

PROMPTS = ["12+34=", "7+45=", "99+1=", "3+3=", "50+50="]  # unequal lengths: left padding
GROUP = 4
# Two constant groups (rows 1 and 3) for remove_constant_reward_groups to drop.
REWARDS = torch.tensor(
    [[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.5, 1.0, 0.0], [0, 0, 0, 0], [1, 0, 0, 0]]
)


def test_pieces_are_consecutive_runs_under_the_budget_and_may_split_a_group():
    # 5 rollouts of width 3; prompts of 4 and 2 tokens, each counted once a piece.
    prompt_of_N = torch.tensor([0, 0, 0, 1, 1])
    prompt_tokens_D = torch.tensor([4, 2])
    cut = split_rows(torch.arange(5), prompt_of_N, prompt_tokens_D, 3, budget=10)
    # [0, 1]: 4 + 3 + 3 = 10; [2, 3]: 4 + 3 + 2 + 3 = 12 > 10, so [2] alone (7), then
    # [3, 4]: 2 + 3 + 3 = 8.
    assert [p.tolist() for p in cut] == [[0, 1], [2], [3, 4]]
    # A rollout over the budget is a piece of its own; a budget over everything, one piece.
    assert [
        p.tolist() for p in split_rows(torch.arange(2), prompt_of_N, prompt_tokens_D, 3, 1)
    ] == [
        [0],
        [1],
    ]
    assert len(split_rows(torch.arange(5), prompt_of_N, prompt_tokens_D, 3, 10**6)) == 1
    # Only the given rows (a minibatch with a group filtered out), in their order.
    assert [
        p.tolist() for p in split_rows(torch.tensor([3, 4]), prompt_of_N, prompt_tokens_D, 3, 5)
    ] == [
        [3],
        [4],
    ]


@pytest.fixture(scope="module")
def float64_rollouts():
    """A float64 tiny policy with a moved adapter, and GROUP rollouts of each prompt from it."""
    from conftest import compose_conf

    torch.manual_seed(0)
    policy = load_policy(compose_conf("output_dir=/tmp/unused", "max_tokens=12"))
    policy.model.double()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # LoRA B starts at zero, which would hide a wrong adapter gradient
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    rollouts = TorchSampler(policy).sample(
        [p for p in PROMPTS for _ in range(GROUP)], SamplingSettings(max_tokens=12)
    )
    return policy, rollouts


def gradients(cfg, policy, rollouts) -> tuple[list[torch.Tensor], torch.Tensor, int]:
    """The minibatch's gradients through the real prepare + backward, its advantages, and how
    many pieces the learner ran."""
    groups = Groups([None] * len(PROMPTS), rollouts, REWARDS, [0] * len(PROMPTS), 0.0)
    prepared = prepare(cfg, policy, groups)
    (rows,) = minibatch_rows(len(PROMPTS), GROUP, 1, prepared.keep_P)
    for p in policy.trainable_parameters():
        p.grad = None
    backward(cfg, policy, prepared, rows)
    grads = [p.grad.clone() for p in policy.trainable_parameters()]
    return grads, prepared.advantages_NT, len(policy.passes.micro_batches(prepared.batch, rows))


@pytest.mark.parametrize("path", ["packed", "shared-cache"])
@pytest.mark.parametrize("kl_penalty_coef", [0.0, 0.1])
@pytest.mark.parametrize("remove_constant", [False, True])
@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_micro_batches_give_the_whole_minibatchs_gradients(
    float64_rollouts, monkeypatch, composed, loss, kl_penalty_coef, remove_constant, path
):
    policy, rollouts = float64_rollouts
    monkeypatch.setattr(packing, "MAX_ROW_TOKENS", 10_000 if path == "packed" else 0)
    overrides = [
        f"loss={loss}",
        f"kl_penalty_coef={kl_penalty_coef}",
        f"remove_constant_reward_groups={remove_constant}",
        "max_tokens=12",
        "loss.mask_truncated_completions=true",  # the token normaliser then differs per row
    ]
    cfg = composed(*overrides)
    whole, whole_adv, one = gradients(cfg, policy, rollouts)
    assert one == 1
    # Pieces of about three rollouts, cut inside groups, and the output layer in chunks of
    # 5 positions (the tiny vocabulary fits one chunk otherwise).
    width = max(len(r.completion_ids) for r in rollouts)
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 5 * policy.tokenizer.vocab_size)
    monkeypatch.setattr(policy.passes, "learner_batch_tokens", 3 * width + 4)
    split, split_adv, num_pieces = gradients(cfg, policy, rollouts)
    assert num_pieces >= 3
    assert torch.allclose(split_adv, whole_adv, rtol=0, atol=1e-12)  # the reference, in pieces
    for s, w in zip(split, whole, strict=True):
        assert torch.allclose(s, w, rtol=1e-5, atol=1e-5 * w.abs().max())
    assert any(w.abs().max() > 0 for w in whole)


def test_chunked_log_probs_and_entropy_equal_the_full_log_softmax(float64_rollouts, monkeypatch):
    policy, rollouts = float64_rollouts
    batch = collate(rollouts, policy.tokenizer.pad_token_id)
    with policy.learner() as model:
        whole_NT, whole_entropy_NT = token_logprobs(model, batch, 0.7, with_entropy=True)
        monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 7 * policy.tokenizer.vocab_size)
        chunked_NT, chunked_entropy_NT = token_logprobs(model, batch, 0.7, with_entropy=True)
    mask = batch.mask_NT.bool()
    assert torch.allclose(chunked_NT[mask], whole_NT[mask], rtol=0, atol=1e-6)
    # (the plain path scores entropy in float32, logprobs.token_entropy)
    assert torch.allclose(chunked_entropy_NT[mask].float(), whole_entropy_NT[mask], atol=1e-5)


@pytest.mark.parametrize("head", ["output layer", "logits"])
def test_the_chunked_backward_is_log_softmaxs_gradient(head, monkeypatch):
    # ChunkLogprobs' hand-written backward, (onehot - softmax) / temperature through the
    # output layer or into given logits, against autograd through one log_softmax (float64).
    torch.manual_seed(0)
    hidden_NTF = torch.randn(2, 9, 6, dtype=torch.float64, requires_grad=True)
    weight_VF = torch.randn(40, 6, dtype=torch.float64, requires_grad=True)
    ids_NT = torch.randint(0, 40, (2, 9))
    upstream_NT = torch.randn(2, 9, dtype=torch.float64)
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 4 * 40)  # 5 chunks, the last one short
    features, weight = (hidden_NTF, weight_VF) if head == "output layer" else (None, None)
    if features is None:
        features = (hidden_NTF @ weight_VF.T).detach().requires_grad_()
    logp_NT, entropy_NT = logprobs.chunked_logprobs(features, ids_NT, 0.7, weight, True)
    wrt = [features] if weight is None else [features, weight]
    grads = torch.autograd.grad((logp_NT * upstream_NT).sum(), wrt)
    logits_NTV = features if weight is None else features @ weight.T
    full_NTV = torch.log_softmax(logits_NTV / 0.7, dim=-1)
    expected_NT = full_NTV.gather(-1, ids_NT[..., None])[..., 0]
    expected = torch.autograd.grad((expected_NT * upstream_NT).sum(), wrt)
    assert torch.allclose(logp_NT, expected_NT, rtol=0, atol=1e-12)
    assert torch.allclose(entropy_NT, -(full_NTV.exp() * full_NTV).sum(-1), rtol=0, atol=1e-12)
    assert not entropy_NT.requires_grad  # a statistic
    for got, want in zip(grads, expected, strict=True):
        assert torch.allclose(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("value", "shown"), [("0", "0"), ("2.5", "2.5"), ("big", "'big'")])
def test_a_micro_batch_that_is_not_auto_or_a_count_is_refused_before_any_model_loads(
    composed, value, shown
):
    from trainer.run.validation import ConfigError, validate

    with pytest.raises(ConfigError, match=rf"^learner_batch_tokens={shown}: must be auto or an"):
        validate(composed(f"learner_batch_tokens={value}"))
    validate(composed("learner_batch_tokens=1024"))
    validate(composed("learner_batch_tokens=auto"))


def test_auto_sizes_a_micro_batch_from_the_models_layers_widths_and_dtype():
    # SmolLM2-135M (30 layers, widths 576 and 1536, float32): (16 * 576 + 6 * 1536) * 4 bytes
    # = 73,728 a layer and token, 2,211,840 for 30 layers; 2 GiB / that = 970.9
    smollm2 = dict(layers=30, hidden=576, mlp=1536, bytes_per_value=4)
    assert micro_batches.token_budget("auto", **smollm2) == 970
    # checkpointed: 30 * 576 * 4 = 69,120 kept + one layer's 73,728 = 142,848 -> 15,033.5
    assert micro_batches.token_budget("auto", **smollm2, checkpointed=True) == 15_033
    # the tiny model (2 layers, 128 and 256): 28,672 a token, so its default batch is one piece
    tiny = micro_batches.token_budget("auto", layers=2, hidden=128, mlp=256, bytes_per_value=4)
    assert tiny == 74_898
    assert micro_batches.token_budget(1024, **smollm2) == 1024  # a number is used as it is
    assert micro_batches.token_budget("auto", **smollm2, budget_bytes=1) == 1  # never 0


@pytest.mark.real_model
def test_on_smollm2_the_output_layer_in_chunks_gives_the_full_log_softmaxs_gradients(
    smollm2, composed, monkeypatch
):
    # The real vocabulary (49,152) and its tied output layer: the chunked path against one
    # log_softmax over every position, in micro-batches of about two rollouts.
    torch.manual_seed(0)
    cfg = composed(f"model.path={smollm2}", "max_tokens=6")
    policy = load_policy(cfg)
    prompts = [  # chat-rendered: as plain text SmolLM2 ends at once, and every rollout alike
        policy.tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q in ("What is 2 + 3? Think step by step.", "What is 7 * 6? Think step by step.")
    ]
    rollouts = TorchSampler(policy).sample(
        [p for p in prompts for _ in range(2)], SamplingSettings(max_tokens=6)
    )
    results = []
    for chunk_elements, budget in ((10**9, 10**6), (3 * 49_152, 14)):
        monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", chunk_elements)
        policy.passes.learner_batch_tokens = budget
        groups = Groups([None, None], rollouts, torch.tensor([[1.0, 0.0], [0.0, 0.5]]), [0, 0], 0.0)
        prepared = prepare(cfg, policy, groups)
        for p in policy.trainable_parameters():
            p.grad = None
        rows = torch.arange(4)
        update = backward(cfg, policy, prepared, rows)
        grads = [p.grad.clone() for p in policy.trainable_parameters() if p.grad is not None]
        results.append((update, grads, len(policy.passes.micro_batches(prepared.batch, rows))))
    (whole, whole_grads, one), (split, split_grads, num_pieces) = results
    assert one == 1 and num_pieces >= 2
    with policy.learner() as model:  # the chunks run on hidden states, not on full logits
        assert logprobs.plain_output_layer(model) is model.get_output_embeddings()
    assert split["entropy"] == pytest.approx(whole["entropy"], rel=1e-4)
    # (the loss itself is ~0 here: advantages sum to 0 in a group and every ratio is 1)
    assert split["loss"] == pytest.approx(whole["loss"], abs=1e-5)
    norm = torch.sqrt(sum(g.square().sum() for g in whole_grads))
    assert norm > 0
    for s, w in zip(split_grads, whole_grads, strict=True):
        assert (s - w).norm() <= 1e-4 * norm
