"""What a training run records beside its hyperparameters, known before it loads a model:
which trainer runs it (`backend`, ours|trl, and its package's version) and the processes it
spans, so a sweep's runs say what trained them. The trainer decides these facts and hands them
to the logger (records/tracking.py logs what it is given, nothing more). What a run decides as
its policy loads (`onednn`) reaches the logger through the reporter (trainer/run/train.py's
report_params)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from omegaconf import DictConfig

from records.metrics import ONEDNN_PARAM
from trainer.backends.trl.recipe import recipe_params


def run_params(cfg: DictConfig) -> dict[str, Any]:
    package = {"trl": "trl"}.get(cfg.backend.name, "grpo-sweeper")
    try:
        backend_version = version(package)
    except PackageNotFoundError:  # a source tree run without installing it
        backend_version = "unknown"
    params = {
        "backend": cfg.backend.name,
        "backend_version": backend_version,
        "world_size": cfg.backend.processes,
    }
    if cfg.backend.name == "trl":  # TRL's trainer never computes through oneDNN; ours says
        params[ONEDNN_PARAM] = "off"  # what it chose once its policy loads
        params.update(recipe_params(cfg))  # the `trl grpo` recipe it started from, if any
    return params
