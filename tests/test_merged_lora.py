"""LoRA merged into the weights (trainer/model/merged_lora.py): the merged layer's closed-form
gradients on hand-computed numbers, then whole models against PEFT's own (log-probs,
gradients, dropout, the fallbacks to PEFT)."""

import pytest
import torch
from conftest import PROMPTS, learner_kl, moved_adapter

from trainer.base.config import TrainConfig
from trainer.model import packing
from trainer.model.fast_logprobs import token_logprobs
from trainer.model.merged_lora import MergedLoRA, MergedLoRAFunction
from trainer.model.policy import Policy
from trainer.model.rollout import Rollout
from trainer.model.token_batch import collate
from trainer.rl import rl_math
from trainer.sampling.model_source import load_policy
from trainer.sampling.protocol import SamplingSettings
from trainer.sampling.torch_sampler import TorchSampler

# W' = W + s B A with W = I, B = [[2], [1]], A = [[1, -1]], s = 0.5:  [[2, -1], [0.5, 0.5]]
MERGED_OUT_IN = [[2.0, -1.0], [0.5, 0.5]]


@pytest.mark.parametrize("fan_in_fan_out", [False, True], ids=["linear", "conv1d"])
def test_output_and_gradients_on_hand_computed_numbers(fan_in_fan_out):
    x = torch.tensor([[1.0, 2.0]], requires_grad=True)
    weight = torch.tensor(MERGED_OUT_IN)
    weight = weight.T.contiguous() if fan_in_fan_out else weight  # Conv1D stores in x out
    bias = torch.tensor([1.0, -1.0])
    lora_A = torch.tensor([[1.0, -1.0]], requires_grad=True)
    lora_B = torch.tensor([[2.0], [1.0]], requires_grad=True)
    y = MergedLoRAFunction.apply(x, weight, bias, lora_A, lora_B, 0.5, fan_in_fan_out)
    # y = x W'^T + b = [1*2 + 2*(-1), 1*0.5 + 2*0.5] + [1, -1]
    assert y.tolist() == [[1.0, 0.5]]
    (y * torch.tensor([[1.0, 3.0]])).sum().backward()  # g = dL/dy = [1, 3]
    assert x.grad.tolist() == [[3.5, 0.5]]  # g W' = [1*2 + 3*0.5, 1*(-1) + 3*0.5]
    assert lora_B.grad.tolist() == [[-0.5], [-1.5]]  # s g^T (x A^T), x A^T = 1 - 2 = -1
    assert lora_A.grad.tolist() == [[2.5, 5.0]]  # s (g B)^T x, g B = 1*2 + 3*1 = 5


@pytest.mark.parametrize("strided_grad", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("fan_in_fan_out", [False, True], ids=["linear", "conv1d"])
def test_gradients_equal_autograd_through_the_unmerged_layer(fan_in_fan_out, strided_grad):
    # The merged weight must be W + s B A for the closed form to hold: build it from the
    # factors; autograd through the unmerged definition, x A^T B^T, is the reference.
    generator = torch.Generator().manual_seed(0)
    w0 = torch.randn(5, 4, dtype=torch.float64, generator=generator)
    bias = torch.randn(5, dtype=torch.float64, generator=generator)
    scale = 0.75

    def layer(x, lora_A, lora_B):
        merged = w0 + scale * lora_B @ lora_A
        weight = merged.T.contiguous() if fan_in_fan_out else merged
        return MergedLoRAFunction.apply(
            x, weight.detach(), bias, lora_A, lora_B, scale, fan_in_fan_out
        )

    def unmerged(x, lora_A, lora_B):
        return x @ w0.T + bias + scale * (x @ lora_A.T) @ lora_B.T

    inputs = (
        torch.randn(2, 3, 4, dtype=torch.float64, generator=generator, requires_grad=True),
        torch.randn(2, 4, dtype=torch.float64, generator=generator, requires_grad=True),
        torch.randn(5, 2, dtype=torch.float64, generator=generator, requires_grad=True),
    )
    assert torch.allclose(layer(*inputs), unmerged(*inputs))
    out_layer, out_unmerged = layer(*inputs), unmerged(*inputs)
    if strided_grad:  # as attention's transposes hand it back: dL/dy arrives non-contiguous
        out_layer, out_unmerged = out_layer.transpose(0, 1), out_unmerged.transpose(0, 1)
    probe = torch.randn(out_layer.shape, dtype=torch.float64, generator=generator)
    grads = torch.autograd.grad((out_layer * probe).sum(), inputs)
    expected = torch.autograd.grad((out_unmerged * probe).sum(), inputs)
    for got, want in zip(grads, expected, strict=True):
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-12)


def test_the_merged_copy_gives_the_peft_models_log_probs_and_follows_updates(composed):
    torch.manual_seed(0)  # LoRA's initialisation draws from it too
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
        # float32 rounding of W + s * B @ A against the three matmuls' sum, grown through the
        # layers by this strongly moved adapter: 1.0e-4 at seed 1, other inits up to 2.5e-4
        assert (merged_NT - peft_NT)[mask].abs().max() < 5e-4
    # The merge is out of place: the base weights (the reference policy) are bit for bit intact.
    for name, param in policy.model.named_parameters():
        if not param.requires_grad:
            assert torch.equal(param, base_before[name]), name


def tiny_causal_lm(kind: str, dropout: float) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    if kind == "gpt2":
        drop = {"resid_pdrop": dropout, "embd_pdrop": dropout, "attn_pdrop": dropout}
        return GPT2LMHeadModel(GPT2Config(vocab_size=19, n_embd=32, n_layer=1, n_head=2, **drop))
    return LlamaForCausalLM(
        LlamaConfig(vocab_size=19, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    )


def moved_peft_model(kind: str, dropout: float = 0.0, lora_dropout: float = 0.0):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    lora = LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=lora_dropout,
        target_modules="all-linear",
        fan_in_fan_out=kind == "gpt2",
    )
    peft_model = get_peft_model(tiny_causal_lm(kind, dropout), lora)
    moved_adapter(Policy(peft_model, None, torch.device("cpu")))
    return peft_model


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_the_merge_adds_peft_own_delta_to_linear_and_conv1d_weights(kind):
    # GPT-2's Conv1D stores its weight as in x out, so PEFT transposes its delta there.
    merged = MergedLoRA(moved_peft_model(kind))
    assert merged.lora_layers
    model = merged.current()
    for name, layer in merged.lora_layers.items():
        expected = layer.base_layer.weight + layer.get_delta_weight("default")
        assert torch.allclose(model.get_submodule(name).weight, expected, atol=1e-6), name


@pytest.mark.parametrize("path", ["packed", "shared-cache"])
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_the_learner_on_the_merged_copy_gives_peft_log_probs_and_gradients(kind, path, monkeypatch):
    # The learner differentiates the merged copy; its layers must hand the adapter the
    # gradient PEFT's own forward would, for nn.Linear and GPT-2's Conv1D alike.
    monkeypatch.setattr(packing, "MAX_ROW_TOKENS", 10_000 if path == "packed" else 0)
    peft_model = moved_peft_model(kind)
    policy = Policy(peft_model, None, torch.device("cpu"))
    generator = torch.Generator().manual_seed(1)
    rollouts = [
        Rollout(
            torch.randint(3, 19, (2 + n % 3,), generator=generator).tolist(),
            torch.randint(3, 19, (1 + n % 4,), generator=generator).tolist(),
            [0.0] * (1 + n % 4),
            True,
            "",
        )
        for n in range(6)
    ]
    batch = collate(rollouts, pad_id=0)
    adapter = policy.trainable_parameters()

    def logprobs_and_grads(model):
        logp_NT, _ = token_logprobs(model, batch, 1.0)
        (logp_NT * batch.mask_NT).sum().backward()
        grads = [p.grad.clone() for p in adapter]
        peft_model.zero_grad(set_to_none=True)
        return logp_NT.detach(), grads

    peft_NT, peft_grads = logprobs_and_grads(peft_model)
    with policy.learner() as model:
        assert model is not peft_model and model.training == peft_model.training
        merged_NT, merged_grads = logprobs_and_grads(model)
    mask = batch.mask_NT.bool()
    assert (merged_NT - peft_NT)[mask].abs().max() < 1e-5
    for merged, peft in zip(merged_grads, peft_grads, strict=True):
        assert (merged - peft).norm() <= 1e-4 * peft.norm()
    assert all(g.norm() > 0 for g in peft_grads)


def test_the_learner_keeps_the_models_dropout_and_the_sampler_goes_without():
    peft_model = moved_peft_model("gpt2", dropout=0.5)
    policy = Policy(peft_model, None, torch.device("cpu"))
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
    with policy.learner() as model:
        assert model is not peft_model and model.training
        assert not torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits)
    with torch.no_grad(), policy.inference() as model:
        assert not model.training
        assert torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits)


@pytest.mark.parametrize("setting", ["lora_dropout", "merge_lora=false"])
def test_the_learner_falls_back_to_peft_where_the_merged_copy_is_not_its_forward(setting):
    # LoRA dropout drops the adapter's input only, which no merged weight can do.
    peft_model = moved_peft_model("llama", lora_dropout=0.1 if setting == "lora_dropout" else 0)
    policy = Policy(peft_model, None, torch.device("cpu"), merge_lora=setting != "merge_lora=false")
    with policy.learner() as model:
        assert model is peft_model


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_precision_model_samples_merged_and_learns_through_peft(composed, dtype):
    # PEFT keeps the adapter of a half-precision model in float32: the merge rounds once into
    # the model's dtype, and the learner stays on PEFT, where the update is not rounded off.
    torch.manual_seed(0)  # LoRA's initialisation draws from it: not what earlier tests left
    policy = load_policy(composed(f"model.dtype={dtype}"))
    moved_adapter(policy)
    torch.manual_seed(0)
    rollouts = TorchSampler(policy).sample(PROMPTS * 2, SamplingSettings())
    batch = collate(rollouts, policy.tokenizer.pad_token_id)
    with policy.learner() as model:
        assert model is policy.model
        logp_NT, _ = token_logprobs(model, batch, 1.0)
        (logp_NT * batch.mask_NT).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in policy.trainable_parameters())
    # The sampler saw the adapter: its log-probs are the learner's to half precision. Both
    # round one policy (the merged W + s B A rounded once; PEFT's half-precision base output
    # plus the float32 adapter's), so their KL is rounding noise, which scales as the unit
    # roundoff squared, whatever CPU kernels run: over 20 LoRA inits on the tiny model, median
    # 2e-4 in bfloat16 and 4e-6 in float16, ~13 u^2 in both. The bound is the sampler_kl health
    # rule's default (rounding alone must not trip it) in bfloat16, 650 u^2, and as many u^2 in
    # float16. An adapter can put one of these ~30 tokens where attention amplifies the
    # rounding ~100x (0.9 nats: KL 0.014 in bfloat16), hence the seed above.
    bound = (
        TrainConfig.kl_threshold
        * (torch.finfo(getattr(torch, dtype)).eps / torch.finfo(torch.bfloat16).eps) ** 2
    )
    assert learner_kl(policy, rollouts) < bound
    # A sampler that missed the adapter (the reference's log-probs) is far outside it.
    reference_NT = policy.logprobs(batch, 1.0, "reference")
    missed = rl_math.kl_sample_train(reference_NT, logp_NT.detach(), batch.mask_NT)[1]
    assert missed > 10 * bound
