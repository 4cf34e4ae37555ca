"""The machine a benchmark ran on, for every result file: the CPU (vendor, model name, family
and model numbers, AVX-512 flags), its core count, and the versions of the packages that set
the speed. `machine(note)` -> a dict for a result's "machine" key."""

from __future__ import annotations

import os
import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

PACKAGES = ("torch", "transformers", "peft", "trl", "accelerate", "optuna", "mlflow", "scipy")
CPUINFO = {"vendor_id": "vendor", "model name": "model_name", "cpu family": "family"}


def cpu() -> dict[str, object]:
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())  # the first core's
    except OSError:  # not Linux
        return {"model_name": platform.processor() or platform.machine()}
    found: dict[str, object] = {name: fields.get(key, "") for key, name in CPUINFO.items()}
    found["model"] = fields.get("model", "")
    flags = fields.get("flags", fields.get("Features", "")).split()
    found["avx512"] = sorted(f for f in flags if f.startswith("avx512"))
    return found


def versions() -> dict[str, str]:
    found = {}
    for package in PACKAGES:
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "absent"
    return found


def machine(note: str = "") -> dict[str, object]:
    """note: how the host was used (e.g. "shared with other jobs")."""
    return {
        "cpu": cpu(),
        "cores": os.cpu_count(),
        "packages": versions(),
        **({"note": note} if note else {}),
    }
