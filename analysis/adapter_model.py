"""The best configuration's LoRA adapter as an MLflow model (`python -m analysis best
--log-model`): MLflow 3's transformers flavour with `base_model_path`, so the model holds the
adapter and the tokenizer and names its local base model, whose path and sha256 it carries in
its tags. It is logged under the study's MLflow run, which links to it by a tag; `analysis
best` prints how to load it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.load import AnalysisError, StudyData, mlflow_client, quick_mlflow
from records.sweep import State, StudyAttr, Tag, replicates
from records.tracking import log_model_under

MODEL_NAME = "tuned-adapter"
BASE_PATH_TAG = "base_model_path"
BASE_HASH_TAG = "base_model_sha256"


@dataclass(frozen=True)
class Adapter:
    """The best configuration's best seed's adapter on disk, and its base model."""

    trial: int
    seed: int
    folder: Path
    base: Path


def best_adapter(data: StudyData) -> Adapter:
    """The adapter of the best trial's best-scoring seed, refused in one line when gone."""
    best = data.best()
    if best is None or data.study is None:
        raise AnalysisError(f"study {data.name!r}: no completed trial, so no tuned adapter")
    done = [r for r in replicates(data.study.trials[best.number]) if r.state == State.COMPLETE]
    seed = max(done, key=lambda r: r.value, default=None)
    if seed is None or not seed.output_dir:
        raise AnalysisError(f"t{best.number}: no completed seed recorded its output folder")
    folder = Path(seed.output_dir) / "adapter"
    config = folder / "adapter_config.json"
    if not config.is_file():
        raise AnalysisError(
            f"t{best.number}: no LoRA adapter in {folder} (lora_rank=0 trains every weight, "
            "or the folder was moved)"
        )
    base = Path(json.loads(config.read_text())["base_model_name_or_path"])
    if not (base / "config.json").is_file():
        raise AnalysisError(f"t{best.number}: its base model {base} is not a local model folder")
    return Adapter(best.number, seed.seed, folder, base)


def base_model_sha256(base: Path) -> str:
    """One hash over the base model's config and weight files, by name and content."""
    digest = hashlib.sha256()
    for file in sorted(base.iterdir()):
        if file.name == "config.json" or file.suffix in (".safetensors", ".bin"):
            digest.update(file.name.encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


def log_adapter_model(data: StudyData) -> str:
    """Log the best adapter as an MLflow model under the study's run; returns its URI."""
    adapter = best_adapter(data)
    uri = data.attrs.get(StudyAttr.MLFLOW_TRACKING_URI)
    run_id = data.attrs.get(StudyAttr.MLFLOW_PARENT_RUN_ID)
    if not uri or not run_id:
        raise AnalysisError(f"study {data.name} recorded no MLflow run to log the model under")
    import mlflow
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(adapter.base), adapter.folder
    )
    tags = {
        BASE_PATH_TAG: str(adapter.base),
        BASE_HASH_TAG: base_model_sha256(adapter.base),
        Tag.STUDY: data.name,
        Tag.TRIAL_NUMBER: str(adapter.trial),
        Tag.SEED: str(adapter.seed),
    }
    return log_model_under(
        uri,
        run_id,
        Tag.ADAPTER_MODEL,
        mlflow.transformers.log_model,
        transformers_model={
            "model": model,
            "tokenizer": AutoTokenizer.from_pretrained(adapter.folder),
        },
        name=MODEL_NAME,
        task="text-generation",
        base_model_path=str(adapter.base),
        pip_requirements=[],  # the project's own install: nothing to infer
        tags=tags,
    )


def logged_model_line(data: StudyData) -> str | None:
    """The comment line saying how to load the study's logged adapter model, if it has one."""
    uri = data.attrs.get(StudyAttr.MLFLOW_TRACKING_URI)
    run_id = data.attrs.get(StudyAttr.MLFLOW_PARENT_RUN_ID)
    if not uri or not run_id:
        return None
    try:
        with quick_mlflow():
            model = mlflow_client(uri).get_run(run_id).data.tags.get(Tag.ADAPTER_MODEL)
    except Exception:  # an unreachable store: the YAML still prints
        return None
    return None if model is None else load_line(model)


def load_line(model_uri: str) -> str:
    return (
        f"# adapter model: {model_uri} (load: mlflow.transformers.load_model('{model_uri}', "
        f"return_type='components'); its base model: the tags {BASE_PATH_TAG}, {BASE_HASH_TAG})"
    )


def model_tags(client: Any, model_uri: str) -> dict[str, str]:
    """A logged model's tags (its base model's path and hash among them)."""
    return dict(client.get_logged_model(model_uri.removeprefix("models:/")).tags)
