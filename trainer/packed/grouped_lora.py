"""One base model serving K LoRA adapters at once: each batch row goes through its own trial's
adapter.

`GroupedLoRALinear` replaces a LoRA-targeted linear layer of the shared base model. Its output
for a batch whose rows belong to several members (trials) is

    y = x W^T + b                       once, for every row (the base layer)
      + s_k (x_k A_k^T) B_k^T           for each member k, on its own rows x_k only

with A_k, B_k the member's own PEFT parameters (not copies: the gradient reaches them, and
their optimizer moves them in place). Rows are member-major: `Segments` says which member owns
which contiguous run of rows. When every member holds the same number of rows the low-rank
products run as two batched matmuls over a K x rows x width view (torch.bmm, then
torch.baddbmm adding s_k B_k's product into the base output in the same op); otherwise one
pair of small matmuls per member. The base layer, the attention, norms and output layer run
once for the whole batch: that is what packing saves.

Numerically the members' outputs equal a solo run's up to float32 rounding: the solo run adds
the adapter into the weight (trainer/model/merged_lora.py), here it is added to the output.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from trainer.model.merged_lora import LinearStandIn


@dataclass
class Segments:
    """Which member owns which rows, for the forward call under way. Keyed by the batch's row
    count: one call may run the prompts first (one row each) and then the rollouts (a row
    each), with different owners per row; equal counts mean the same owners."""

    by_rows: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)  # (k, start, end)
    adapters_on: bool = True  # False: the reference policy, every adapter off
    factors: dict = field(default_factory=dict)  # stacked adapters, built once for no-grad calls


class PackedAdapters:
    """The members' adapters, by layer, and the segments of the forward call under way."""

    def __init__(self) -> None:
        self.segments: Segments | None = None
        self.layers: list[GroupedLoRALinear] = []

    @contextlib.contextmanager
    def rows(self, segments: Segments) -> Iterator[None]:
        self.segments = segments
        try:
            yield
        finally:
            self.segments = None

    def attach(self, member: int, factors: dict[str, tuple[torch.Tensor, torch.Tensor, float]]):
        """A member's (A, B, scale) for every grouped layer, by the layer's module name."""
        for layer in self.layers:
            layer.adapters[member] = factors[layer.name]

    def detach(self, member: int) -> None:
        for layer in self.layers:
            layer.adapters.pop(member, None)


class GroupedLoRALinear(LinearStandIn):
    """A base linear layer plus each member's low-rank delta on the member's own rows."""

    def __init__(self, name: str, base_layer: torch.nn.Linear, packed: PackedAdapters) -> None:
        super().__init__()
        self.name = name
        self.base_layer = base_layer  # PEFT's name for it: the members' base weights tie by name
        self.packed = (packed,)  # a tuple: not a submodule
        self.adapters: dict[int, tuple[torch.Tensor, torch.Tensor, float]] = {}

    def stand_in_for(self) -> torch.nn.Module:
        return self.base_layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base_layer(x)
        segments = self.packed[0].segments
        if segments is None or not segments.adapters_on:
            return y
        owners = segments.by_rows[x.shape[0]]
        factors = self.factors(segments, owners)
        width = y.shape[-1]
        if isinstance(
            factors[0], torch.Tensor
        ):  # every member the same number of rows: batched matmuls
            A_KRF, Bs_KOR = factors
            x_KMF = x.reshape(len(owners), -1, x.shape[-1])
            low_KMR = torch.bmm(x_KMF, A_KRF.transpose(1, 2))
            # y + (s B) applied to the low-rank product, in one op: no separate scale and add
            # over the full-width output
            y_KMO = y.view(len(owners), -1, width)
            return torch.baddbmm(y_KMO, low_KMR, Bs_KOR.transpose(1, 2)).view_as(y)
        parts = []
        for (_, start, end), lora_A, lora_Bs in zip(owners, *factors, strict=True):
            x_MF, y_MO = x[start:end].reshape(-1, x.shape[-1]), y[start:end].reshape(-1, width)
            parts.append(torch.addmm(y_MO, x_MF @ lora_A.T, lora_Bs.T).view_as(y[start:end]))
        return torch.cat(parts)

    def factors(self, segments: Segments, owners: list[tuple[int, int, int]]):
        """The owners' A and s B, stacked when their row counts are equal. Without a gradient
        (sampling: one forward a token) they are built once per call to the host."""
        cached = segments.factors.get((self.name, len(owners)))
        if cached is not None and not torch.is_grad_enabled():
            return cached
        adapters = [self.adapters[m] for m, _, _ in owners]
        lora_A = [a for a, _, _ in adapters]
        lora_Bs = [b * s for _, b, s in adapters]  # s B: exact for the usual power-of-two s
        if len({end - start for _, start, end in owners}) == 1:
            factors = (torch.stack(lora_A), torch.stack(lora_Bs))
        else:
            factors = (lora_A, lora_Bs)
        if not torch.is_grad_enabled():
            segments.factors[(self.name, len(owners))] = factors
        return factors


def install(model: torch.nn.Module, targets: list[str]) -> PackedAdapters:
    """Replace the named linear layers of `model` (in place) by grouped ones; returns the
    handle through which members attach their adapters and forward calls name their rows."""
    packed = PackedAdapters()
    for name in targets:
        parent, _, leaf = name.rpartition(".")
        owner = model.get_submodule(parent)
        layer = GroupedLoRALinear(name, getattr(owner, leaf), packed)
        setattr(owner, leaf, layer)
        packed.layers.append(layer)
    return packed
