"""A `trl grpo` recipe's ModelConfig as our model keys: model.path, model.dtype and lora_*
(recipe.py's `recipe_values` puts them), the LoRA targets in every form TRL hands PEFT.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from trainer.backends.trl.recipe_file import Recipe, refuse

# ModelConfig fields the run cannot honour, at the values that need nothing
MODEL_AS_IS = {
    "model_revision": "main",
    "attn_implementation": None,
    "lora_target_parameters": None,
    "lora_modules_to_save": None,
    "lora_task_type": "CAUSAL_LM",
    "use_rslora": False,
    "use_dora": False,
    "load_in_8bit": False,
    "load_in_4bit": False,
}


def model_values(recipe: Recipe, put) -> None:
    m = recipe.model
    for name, as_is in MODEL_AS_IS.items():
        if getattr(m, name) != as_is:
            raise refuse(name, getattr(m, name), "not honoured by the sweep; leave it out")
    path = m.model_name_or_path
    if not path or not Path(path).expanduser().is_dir():
        raise refuse(
            "model_name_or_path", path, "must be a local model directory (no hub downloads)"
        )
    put("model.path", str(Path(path).expanduser()))
    put("model.dtype", lambda: _dtype(m.dtype, path))
    put("lora_rank", m.lora_r if m.use_peft else 0)
    put("lora_alpha", m.lora_alpha)
    put("lora_dropout", float(m.lora_dropout))
    put("lora_target_modules", lambda: _lora_targets(m.lora_target_modules, path))


def _lora_targets(given: str | list[str] | None, model_dir: str) -> list[str]:
    """The recipe's lora_target_modules in every form TRL hands PEFT: a list of module names;
    `all-linear`; any other string, a regex PEFT full-matches against each module's whole
    name (ModelConfig turns a one-name list into that string); None, PEFT's default for the
    model's type, as TRL's get_peft_config leaves it to PEFT."""
    if isinstance(given, str):
        return ["all-linear"] if given == "all-linear" else _regex_targets(given, model_dir)
    if given:
        return list(given)
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    model_type = model_config(model_dir).get("model_type")
    if model_type not in TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING:
        raise refuse("lora_target_modules", None, f"PEFT has no default for {model_type!r}")
    return list(TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING[model_type])


def _dtype(given: str | None, model_dir: str) -> str:
    """ModelConfig's dtype as our model.dtype: `auto` (or None) is the checkpoint's own, as
    transformers reads it (float32 where the config names none)."""
    if given not in (None, "auto"):
        return given
    config = model_config(model_dir)
    return str(config.get("dtype") or config.get("torch_dtype") or "float32")


def model_config(model_dir: str) -> dict[str, Any]:
    import json

    return json.loads((Path(model_dir) / "config.json").read_text())


def _regex_targets(pattern: str, model_dir: str) -> list[str]:
    """The module names a regex target matches, as a list PEFT matches the same modules by:
    their last parts when the regex takes every module of those names, else whole names."""
    import re

    names = _linear_modules(model_dir)
    try:
        matched = [name for name in names if re.fullmatch(pattern, name)]
    except re.error as e:
        raise refuse("lora_target_modules", pattern, f"not a regex PEFT can read ({e})") from None
    if not matched:
        raise refuse(
            "lora_target_modules",
            pattern,
            "one name is a regex over whole module names in TRL and PEFT, and this one matches "
            "no linear layer of the model; list the names ([q_proj, v_proj]) or give a regex "
            "such as '.*\\.q_proj'",
        )
    last = {name.rsplit(".", 1)[-1] for name in matched}
    every = [name for name in names if name.rsplit(".", 1)[-1] in last]
    return sorted(last) if every == matched else matched


@cache
def _linear_modules(model_dir: str) -> list[str]:
    """The whole names of the model's linear layers, from its config alone (no weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
