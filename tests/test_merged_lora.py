"""The merged layer's closed-form LoRA gradients (trainer/model/merged_lora.py), on hand-computed
numbers; the whole-model comparison with PEFT is in tests/test_sampling.py."""

import pytest
import torch

from trainer.model.merged_lora import MergedLoRAFunction

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
