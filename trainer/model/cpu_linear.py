"""Float32 linear layers on a CPU through oneDNN rather than the BLAS torch picks for them.

torch's CPU wheel runs a float32 `F.linear` / `torch.mm` through MKL, and MKL on a CPU that is
not Intel's takes its generic AVX2 code. oneDNN, in the same wheel (the kernels torch.compile
uses for linear layers on a CPU, `torch.ops.mkldnn._linear_pointwise`), uses the AVX-512 the CPU
has: on this project's AMD EPYC (Zen 5) machines it is about twice as fast at a real model's
shapes, in float32, to float32's rounding (measured in bench/BENCHMARKS.md). `linear` takes it
wherever it applies: the sampler's decoding, the learner's merged layers
(trainer/model/merged_lora.py), the output layer's chunks (trainer/model/logprobs.py);
`use_onednn` switches a model's own nn.Linear layers.

Weights under MIN_WEIGHT_ELEMENTS stay on torch's path: there the call's overhead is what
counts, and every recorded tiny-model result was made there, bit for bit. GRPO_SWEEPER_ONEDNN=0
in the environment keeps every layer on torch's path (to compare, or to rule oneDNN out), as
does `torch.backends.mkldnn.enabled = False`. oneDNN follows torch's float32 matmul precision:
`torch.set_float32_matmul_precision("medium")` lets it use bfloat16 where the CPU has it.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

MIN_WEIGHT_ELEMENTS = 1 << 16  # the tiny model's largest weight is 128 x 256 = 32,768
AVAILABLE = (
    os.environ.get("GRPO_SWEEPER_ONEDNN", "1") != "0"
    and torch.backends.mkldnn.is_available()
    and hasattr(torch.ops.mkldnn, "_linear_pointwise")
)


def takes_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (  # the size first: a small model's layers are turned away at once
        AVAILABLE
        and weight.numel() >= MIN_WEIGHT_ELEMENTS
        and x.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
        and torch.backends.mkldnn.enabled  # a user's switch for oneDNN, read at each call
    )


def onednn_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ weight^T + bias in oneDNN, without autograd (weight may be a transposed view)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, through oneDNN where it applies (takes_onednn), differentiable either way."""
    if not takes_onednn(x, weight):
        return F.linear(x, weight, bias)
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    if needs_grad:
        return OneDNNLinearFunction.apply(x, weight, bias)
    return onednn_linear(x, weight, bias)


class OneDNNLinearFunction(torch.autograd.Function):
    """y = x W^T + b with each product in oneDNN: dL/dx = g W, dL/dW = g^T x, dL/db = sum g."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return onednn_linear(x, weight, bias)

    @staticmethod
    @once_differentiable  # oneDNN's op has no derivative of its own
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = onednn_linear(grad_out, weight.T)
        g = grad_out.reshape(-1, grad_out.shape[-1])
        if ctx.needs_input_grad[1]:
            grad_weight = g.T @ x.reshape(-1, x.shape[-1])
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = g.sum(0)
        return grad_x, grad_weight, grad_bias


class OneDNNLinear(torch.nn.Linear):
    """nn.Linear whose forward is `linear` above; the same parameters, state dict and repr."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def use_onednn(model: torch.nn.Module) -> None:
    """Every plain nn.Linear of the model computes through `linear` from now on. The class is
    switched in place (a subclass that adds no state), so the parameters and any weights tied
    to them stay the same tensors."""
    if not AVAILABLE:
        return
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = OneDNNLinear
