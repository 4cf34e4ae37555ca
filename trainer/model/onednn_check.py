"""Whether oneDNN's float32 linear layers beat torch's on this host, at a model's own shapes.

`decision(shapes, onednn, reference)` answers (use, why): oneDNN must give torch's values to
float32's rounding (the product and its transpose, as the backward takes it) and be faster by
the median of alternated timings. The answer is cached per host (the CPU's model and flags),
torch version and shape set in a small JSON under CACHE_DIR, written atomically, so every
trial, seed and resume of a sweep on that host computes with the same kernels.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

Shape = tuple[int, int]  # a weight's (out, in)
Product = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # x, weight -> x weight^T

CACHE_DIR = Path("~/.cache/grpo-sweeper/onednn").expanduser()
ROWS = 64  # a decoding step's batch and a learner's micro-batch are both tens to hundreds
ROUNDS = 5  # alternated timings of each path
FASTER = 0.9  # oneDNN must take at most this share of torch's time: a clear gain, not noise
RTOL = 1e-4  # float32's rounding over a few thousand-long dot product, with room


def cpu_identity() -> str:
    """The CPU's model name and a hash of its flags (what a kernel's speed depends on)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())  # the first core's
    except OSError:  # not Linux: the platform's name alone
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    flags = fields.get("flags") or fields.get("Features", "")  # x86, ARM
    return f"{name} flags:{hashlib.sha256(flags.encode()).hexdigest()[:12]}"


def cache_path(shapes: list[Shape]) -> Path:
    key = json.dumps([cpu_identity(), torch.__version__, shapes])
    return CACHE_DIR / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def check(shapes: Iterable[Shape], onednn: Product, reference: Product) -> tuple[bool, str]:
    """Values within float32's rounding of `reference`'s, then the alternated timings."""
    generator = torch.Generator().manual_seed(0)
    cases = []
    for out, inp in shapes:
        weight = torch.randn(out, inp, generator=generator) * inp**-0.5
        cases.append((torch.randn(ROWS, inp, generator=generator), weight))
        cases.append((torch.randn(ROWS, out, generator=generator), weight.T))  # the backward's
    for x, weight in cases:
        got, want = onednn(x, weight), reference(x, weight)
        if not torch.allclose(got, want, rtol=RTOL, atol=RTOL * want.abs().max().item()):
            error = (got - want).abs().max().item()
            return False, f"values differ from torch's by {error:.2e} at {tuple(weight.shape)}"

    def seconds(product: Product) -> float:
        started = time.perf_counter()
        for x, weight in cases:
            product(x, weight)
        return time.perf_counter() - started

    timings: dict[Product, list[float]] = {onednn: [], reference: []}
    for _ in range(ROUNDS):  # torch, oneDNN, torch, oneDNN: load drift hits both alike
        for product in timings:
            timings[product].append(seconds(product))
    ours, theirs = (statistics.median(timings[p]) for p in (onednn, reference))
    verdict = f"{ours * 1e3:.1f} ms against torch's {theirs * 1e3:.1f} ms"
    return ours <= FASTER * theirs, verdict


def decision(shapes: list[Shape], onednn: Product, reference: Product) -> tuple[bool, str]:
    """The cached answer for these shapes on this host and torch, else `check`'s, stored."""
    path = cache_path(shapes)
    try:
        stored = json.loads(path.read_text())
        return bool(stored["use"]), f"{stored['why']} (cached in {path})"
    except (OSError, ValueError, KeyError):  # none yet, or unreadable: check again
        pass
    use, why = check(shapes, onednn, reference)
    record = {"use": use, "why": why, "cpu": cpu_identity(), "torch": torch.__version__}
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        json.dump({**record, "shapes": shapes}, f)
    os.replace(f.name, path)  # atomic: a concurrent trial reads the old file or the new one
    return use, why
