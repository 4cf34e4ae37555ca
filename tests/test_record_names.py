"""Every record name in one of its two homes: records/metrics.py (what a run logs) and
records/sweep.py (what a sweep records). A record name spelled as a string anywhere else in
the packages is a second copy that can drift; this test finds them with `ast`, the way
tests/test_import_graph.py reads imports.

Which strings count as record names: the homes' namespaced metrics (`reward/mean`, `time/...`),
the KL estimators (`kl_...`), MLflow tags (`sweeper.*`), Optuna trial attrs with an underscore
(`mlflow_run_id`) and the configuration run's metrics. Plain words that are also setting names
(`lr`, `objective`, `seeds`) are left out: a config key may be spelled where it is read.
"""

from __future__ import annotations

import ast
from pathlib import Path

from records import metrics
from records.sweep import (
    BREACH_CONSTRAINT,
    FORECAST_HIGH,
    FORECAST_MEAN,
    WARNING_METRIC_PREFIX,
    ConfigMetric,
    StudyAttr,
    StudyMetric,
    Tag,
    TrialAttr,
)

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("records", "trainer", "sweeper", "analysis", "hydra_plugins")
HOMES = {ROOT / "records/metrics.py", ROOT / "records/sweep.py"}


def _constants(namespace: object) -> list[str]:
    return [v for k, v in vars(namespace).items() if k.isupper() and isinstance(v, str)]


def record_names() -> set[str]:
    logged = {v for v in _constants(metrics) if "/" in v or v.startswith("kl_")}
    recorded = {
        *_constants(Tag),
        *_constants(ConfigMetric),
        *_constants(StudyMetric),
    }
    recorded |= {v for v in _constants(TrialAttr) if "_" in v}
    return logged | recorded


def literals_outside_homes(sources: dict[str, str], names: set[str]) -> list[str]:
    """`path:line 'name'` for each string constant equal to a record name."""
    found = []
    for where, text in sorted(sources.items()):
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{where}:{node.lineno} {node.value!r}")
    return found


def _package_sources() -> dict[str, str]:
    paths = (p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
    return {str(p.relative_to(ROOT)): p.read_text() for p in paths if p not in HOMES}


def test_the_record_names_cover_both_homes():
    names = record_names()
    assert {metrics.EVAL_REWARD, metrics.KL_PRE_POST_V2, metrics.ASYNC_DISCARDED} <= names
    assert {Tag.PRUNE_REASON, TrialAttr.MLFLOW_RUN_ID} <= names
    assert ConfigMetric.OBJECTIVE_MEAN in names
    assert "lr" not in names  # a setting's name too


def test_no_record_name_is_spelled_outside_its_home():
    found = literals_outside_homes(_package_sources(), record_names())
    assert not found, (
        "record names spelled outside records/metrics.py / records/sweep.py:\n" + "\n".join(found)
    )


def test_a_planted_literal_is_caught():
    planted = {
        "sweeper/planted.py": 'client.log_metric(run_id, "objective/mean", 1.0)\n'
        'x = {"eval/reward/mean": 0.5}\n',
        "trainer/clean.py": "from records.metrics import EVAL_REWARD\n",
    }
    assert literals_outside_homes(planted, record_names()) == [
        "sweeper/planted.py:1 'objective/mean'",
        "sweeper/planted.py:2 'eval/reward/mean'",
    ]


def sweep_record_names() -> set[str]:
    """Every name a sweep records (records/sweep.py): tags, study and trial attrs, the study's
    and a configuration's metrics, the forecast metrics and the breach constraint."""
    names = set()
    for namespace in (Tag, StudyAttr, TrialAttr, StudyMetric, ConfigMetric):
        names |= set(_constants(namespace))
    return names | {FORECAST_MEAN, FORECAST_HIGH, BREACH_CONSTRAINT, WARNING_METRIC_PREFIX}


def test_docs_records_md_names_every_sweep_record():
    doc = (ROOT / "docs/records.md").read_text()
    names = {name.rstrip(".").removesuffix("_") for name in sweep_record_names()}
    missing = sorted(name for name in names if f"`{name}" not in doc)
    assert not missing, f"docs/records.md does not name: {missing}"
