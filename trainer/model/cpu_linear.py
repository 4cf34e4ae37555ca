"""Float32 linear layers on a CPU through oneDNN rather than the BLAS torch picks for them.

torch's CPU wheel runs a float32 `F.linear` / `torch.mm` through MKL, and MKL on a CPU that is
not Intel's takes its generic AVX2 code. oneDNN, in the same wheel
(`torch.ops.mkldnn._linear_pointwise`), uses the AVX-512 the CPU has: faster at a real
model's shapes on the AMD CPUs measured, in float32, to float32's rounding (the measured
factors: bench/BENCHMARKS.md). Whether it is used is decided per host by a check on the
model's own shapes (trainer/model/onednn_check.py). torch.compile does not do this for us: on x86 it keeps float32 linear
layers on MKL (packed, with freezing) and takes oneDNN's op for bfloat16 and float16 only.
`linear` takes it wherever it applies: the sampler's decoding, the learner's merged layers
(trainer/model/merged_lora.py), the output layer's chunks (trainer/model/logprobs.py);
`use_onednn` switches a model's own nn.Linear layers.

GRPO_SWEEPER_ONEDNN (MODES) chooses: `auto` (the default) lets `decide` check a model's own
shapes on this host (trainer/model/onednn_check.py: the same values, and faster) and keeps
torch's path on any other result or any exception, with one log line saying why; `1` forces
oneDNN, `0` torch's path. Weights under MIN_WEIGHT_ELEMENTS stay on torch's path whatever the
setting: there the call's overhead is what counts, and every recorded tiny-model result was
made there, bit for bit; so does everything with `torch.backends.mkldnn.enabled = False`.
oneDNN follows torch's float32 matmul precision: `torch.set_float32_matmul_precision("medium")`
lets it use bfloat16 where the CPU has it.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from trainer.model import onednn_check

log = logging.getLogger(__name__)

MIN_WEIGHT_ELEMENTS = 1 << 16  # the tiny model's largest weight is 128 x 256 = 32,768
VARIABLE = "GRPO_SWEEPER_ONEDNN"
MODES = ("auto", "1", "0")
AVAILABLE = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def mode() -> str:
    value = os.environ.get(VARIABLE, "auto")
    if value not in MODES:
        raise ValueError(f"{VARIABLE}={value!r}: must be one of {', '.join(MODES)}")
    return value


# Whether `linear` takes oneDNN: forced by the setting, else what `decide` found (torch's path
# until it has run).
ENABLED = AVAILABLE and os.environ.get(VARIABLE) == "1"
decided: dict[tuple, tuple[bool, str]] = {}  # shapes -> (use, why), this process's answers


def weight_shapes(model: torch.nn.Module) -> list[tuple[int, int]]:
    """The distinct (out, in) of the model's linear weights that oneDNN would take."""
    shapes = {
        tuple(m.weight.shape)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear)
        and m.weight.numel() >= MIN_WEIGHT_ELEMENTS
        and "lora_" not in name  # an adapter's factors: not the model's shapes
    }
    return sorted(shapes)


def choice(model: torch.nn.Module) -> tuple[bool, str]:
    """Whether this process should compute the model's large float32 linear layers in oneDNN,
    and why. `auto` checks the model's shapes once per host, torch and shape set."""
    setting, shapes = mode(), weight_shapes(model)
    if not AVAILABLE or setting == "0" or not shapes:
        return (
            False,
            (
                "this torch has no oneDNN"
                if not AVAILABLE
                else f"{VARIABLE}=0"
                if setting == "0"
                else "no weight that large"
            ),
        )
    if setting == "1":
        return True, f"{VARIABLE}=1"
    if tuple(shapes) not in decided:
        try:
            use, why = onednn_check.decision(shapes, onednn_linear, F.linear)
        except Exception as e:  # an op that rejects an input on this torch: torch's path
            use, why = False, f"the check failed: {type(e).__name__}: {e}"
        decided[tuple(shapes)] = use, why
        if use:
            log.info("oneDNN for float32 linear layers: %s", why)
        else:
            log.warning("oneDNN off, torch's linear layers instead: %s", why)
    return decided[tuple(shapes)]


def decide(model: torch.nn.Module) -> tuple[bool, str]:
    """`choice`, and this process computes by it from now on (sets ENABLED)."""
    global ENABLED
    use, why = choice(model)
    ENABLED = use
    return use, why


def takes_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (  # the size first: a small model's layers are turned away at once
        ENABLED
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


def checkpoint_choice(path: str) -> tuple[bool, str]:
    """`choice` for the model in a checkpoint directory, from its shapes alone (built on the
    meta device: no weights loaded), so a run can record it before it trains; ENABLED is left
    as it is (the policy's own load decides)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    return choice(model)  # outside: the check's own tensors are real


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
    to them stay the same tensors. Nothing changes where `decide` keeps torch's path."""
    if not decide(model)[0]:
        return
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = OneDNNLinear
