"""A copy of a PEFT LoRA model with the adapter folded into its weights, kept current.

Sampling, the post-update KL and (where the adapter is plain LoRA) the learner's forward run on
it: one matmul a layer instead of PEFT's three, a scale and an add. The learner still trains
PEFT's own adapter tensors: each merged layer hands the gradient to them in closed form
(`MergedLoRAFunction`), so nothing full-size is formed for the gradient and PEFT keeps owning
the adapter (saving, loading, the reference policy with the adapter off).
"""

from __future__ import annotations

import copy

import torch
from peft import PeftModel
from peft.tuners.lora import Linear as LoraLinear
from peft.tuners.lora import LoraLayer

from trainer.model.cpu_linear import linear, use_onednn


class MergedLoRA:
    """A plain copy of a PEFT model with W + scale * B @ A in every LoRA layer.

    Only the LoRA-wrapped weights are copied; embeddings, norms and untargeted layers are the
    base model's own tensors. The merge is out of place, so the base weights never drift
    (merging into them and unmerging again would not give them back bit for bit). The log-probs
    equal the PEFT model's up to float rounding (tests/test_sampling.py).
    """

    def __init__(self, peft_model: PeftModel) -> None:
        base = peft_model.get_base_model()
        self.lora_layers = {n: m for n, m in base.named_modules() if isinstance(m, LoraLayer)}
        self.model = copy.deepcopy(peft_model).merge_and_unload().eval().requires_grad_(False)
        shared = dict(base.named_parameters(remove_duplicate=False))
        for name, _ in list(self.model.named_parameters(remove_duplicate=False)):
            if name in shared:  # untouched by LoRA: share it, do not hold a second copy
                module_name, _, leaf = name.rpartition(".")
                setattr(self.model.get_submodule(module_name), leaf, shared[name])
        self.adapter = [p for m in self.lora_layers.values() for p in m.parameters()]
        adapter = peft_model.active_adapter  # load_policy's one plain LoRA adapter
        self.merges = [  # (merged weight, base weight, left, right, scale) for out = W + s L R
            (self.model.get_submodule(n).weight, m.base_layer.weight, *lora_factors(m, adapter))
            for n, m in self.lora_layers.items()
        ]
        # The learner may differentiate this copy only where PEFT's forward is exactly
        # x W^T + s * lora_B(lora_A(x)) (see is_plain_lora).
        self.trainable = all(is_plain_lora(m, adapter) for m in self.lora_layers.values())
        if self.trainable:
            for name, layer in self.lora_layers.items():
                parent, _, leaf = name.rpartition(".")
                owner = self.model.get_submodule(parent)
                setattr(owner, leaf, MergedLoRALinear(getattr(owner, leaf), layer, adapter))
        use_onednn(self.model)  # its plain linear layers (the output layer), on a CPU
        self.modules = list(self.model.modules())  # to switch train/eval without a tree walk
        self.adapter_versions: tuple[int, ...] | None = None
        self.stale = True  # set by Policy.weights_changed after every optimizer step

    def _adapter_versions(self) -> tuple[int, ...]:
        # A tensor's _version counts its in-place changes through autograd-visible ops
        # (checkpoint loads, copies, a test's add_), which need no call to weights_changed.
        return tuple(p._version for p in self.adapter)

    @torch.no_grad()
    def current(self) -> torch.nn.Module:
        """The copy with the adapter's current values merged in."""
        versions = self._adapter_versions()
        if self.stale or versions != self.adapter_versions:
            # one kernel a layer (PEFT's get_delta_weight takes three and a temporary)
            for merged, base, left, right, scale in self.merges:
                if left.dtype == merged.dtype:
                    torch.addmm(base, left, right, alpha=scale, out=merged)
                else:  # PEFT keeps a bfloat16 model's adapter in float32: round once, at the end
                    merged.copy_(torch.addmm(base.to(left.dtype), left, right, alpha=scale))
            self.adapter_versions, self.stale = versions, False
        return self.model

    def set_training(self, training: bool) -> None:
        """Train or eval mode (dropout), by flag: Module.train() walks the module tree, and
        Module.__setattr__ checks each name against the parameters and submodules before it
        sets the plain attribute `training`; on a small model both show in every step."""
        for module in self.modules:
            object.__setattr__(module, "training", training)


def lora_factors(layer: LoraLayer, adapter: str) -> tuple[torch.Tensor, torch.Tensor, float]:
    """L, R and s with the layer's weight update s * L @ R: PEFT's delta (B @ A) * s, transposed
    for fan-in-fan-out layers (GPT-2's Conv1D stores W as in x out)."""
    lora_A, lora_B = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight
    if layer.fan_in_fan_out:
        return lora_A.T, lora_B.T, layer.scaling[adapter]
    return lora_B, lora_A, layer.scaling[adapter]


def is_plain_lora(layer: LoraLayer, adapter: str) -> bool:
    """No LoRA dropout, DoRA, LoRA bias or quantized base, and a weight as precise as the
    adapter: PEFT keeps a bfloat16 model's adapter in float32, and a merged bfloat16 weight
    would round off the small update it adds."""
    return (
        type(layer) is LoraLinear  # nn.Linear or Conv1D underneath, not a quantized layer
        and isinstance(layer.lora_dropout[adapter], torch.nn.Identity)
        and not layer.use_dora[adapter]
        and not layer.lora_bias[adapter]
        and layer.base_layer.weight.dtype == layer.lora_A[adapter].weight.dtype
    )


class LinearStandIn(torch.nn.Module):
    """A module put where a linear layer was: model code may read that layer's weight (its
    dtype) and bias, so both are the layer's it stands in for."""

    def stand_in_for(self) -> torch.nn.Module:
        raise NotImplementedError

    @property
    def weight(self) -> torch.Tensor:
        return self.stand_in_for().weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.stand_in_for().bias


class MergedLoRALinear(LinearStandIn):
    """A merged linear layer (W' = W + s B A) that, when gradients are on, passes them to the
    adapter's A and B as PEFT's layer would; with them off, it is the plain layer."""

    def __init__(self, merged: torch.nn.Module, layer: LoraLayer, adapter: str) -> None:
        super().__init__()
        self.merged = merged
        # A tuple, so the adapter's tensors stay PEFT's parameters and not this copy's.
        self.lora = (layer.lora_A[adapter].weight, layer.lora_B[adapter].weight)
        self.scale = layer.scaling[adapter]
        self.fan_in_fan_out = layer.fan_in_fan_out

    def stand_in_for(self) -> torch.nn.Module:
        return self.merged

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():  # sampling, the post-update KL
            return self.merged(x)
        return MergedLoRAFunction.apply(
            x, self.weight, self.bias, *self.lora, self.scale, self.fan_in_fan_out
        )


class MergedLoRAFunction(torch.autograd.Function):
    """y = x M + b with M = M0 + s A^T B^T (W' = M^T for nn.Linear, M itself for Conv1D): the
    merged layer's output, and the gradients PEFT's three-matmul path would give A and B,

        dL/dB = s g^T (x A^T),   dL/dA = s (g B)^T x,   dL/dx = g M^T,

    with g = dL/dy. The full-size weight gradient g^T x is never formed."""

    # forward(ctx, ...) rather than a separate setup_context: with one, every apply() binds its
    # arguments through inspect.signature, a cost paid by every adapted layer in every forward.
    @staticmethod
    def forward(ctx, x, weight, bias, lora_A, lora_B, scale, fan_in_fan_out):
        ctx.save_for_backward(x, weight, lora_A, lora_B)
        ctx.scale, ctx.fan_in_fan_out = scale, fan_in_fan_out
        if fan_in_fan_out:  # transformers' Conv1D (weight in x out), computed as it computes it
            x2 = x.reshape(-1, x.shape[-1])
            out = x2 @ weight if bias is None else torch.addmm(bias, x2, weight)
            return out.view(*x.shape[:-1], weight.shape[1])
        return linear(x, weight, bias)  # grad is off here: oneDNN's product where it applies

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, lora_A, lora_B = ctx.saved_tensors
        grad_x = grad_A = grad_B = None
        g = grad_out.reshape(-1, grad_out.shape[-1])  # tokens x out, one copy if strided
        x2 = x.reshape(-1, x.shape[-1])
        if ctx.needs_input_grad[0]:  # a 2-D mm: a strided 3-D grad_out would take a bmm
            # g M^T as a linear layer (oneDNN's product where it applies): of weight W' = M^T
            grad_x = linear(g, weight if ctx.fan_in_fan_out else weight.T)
            grad_x = grad_x.view(*grad_out.shape[:-1], grad_x.shape[-1])
        # Both products reduce over the tokens into rank-wide results, computed in the order
        # MKL is much faster at: (x A^T)^T g, r x out, not g^T (x A^T), out x r
        # (bench/BENCHMARKS.md has the timings).
        if ctx.needs_input_grad[4]:
            grad_B = torch.mm((x2 @ lora_A.T).T, g).mul_(ctx.scale).T
        if ctx.needs_input_grad[3]:
            grad_A = torch.mm((g @ lora_B).T, x2).mul_(ctx.scale)
        return grad_x, None, None, grad_A, grad_B, None, None
