"""Every MLflow write in one module, records/tracking.py: the trainer, the sweeper and the
analysis write through its MLflowRun and tag_experiment, so each write is made by the client
that waits out an unreachable store (tracking_client). This test finds a write made anywhere
else with `ast`, the way tests/test_import_graph.py reads imports.

A write is a call of one of MlflowClient's write methods (`client.set_tag(...)`) on anything,
or of one of MLflow's fluent functions (`mlflow.log_metric(...)`), or a fluent function
imported by name (`from mlflow import log_metric`). MLflowRun's own methods are named apart
from the client's (`save_text`, not `log_text`) so that a name alone tells them apart.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("trainer", "sweeper", "analysis", "hydra_plugins")
HOME = ROOT / "records/tracking.py"

# A public name of MlflowClient or of the mlflow module that changes what the store holds
# (or, for the fluent functions, which run or store the process writes to).
WRITE_PREFIXES = (
    "add_",
    "autolog",
    "copy_",
    "create_",
    "delete_",
    "detach_",
    "end_",
    "finalize_",
    "link_",
    "log_",
    "refresh_",
    "register_",
    "remove_",
    "rename_",
    "restore_",
    "set_",
    "start_",
    "transition_",
    "unlink_",
    "update_",
)


def _writes(namespace: object) -> frozenset[str]:
    return frozenset(n for n in dir(namespace) if n.startswith(WRITE_PREFIXES))


CLIENT_WRITES = _writes(MlflowClient)
FLUENT_WRITES = _writes(mlflow)


def _is_mlflow(node: ast.expr) -> bool:
    """`mlflow`, or an attribute of it (`mlflow.tracking.fluent`)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "mlflow"


def writes_outside_home(sources: dict[str, str]) -> list[str]:
    """`path:line name` for each MLflow write a source makes itself."""
    found = []
    for where, text in sorted(sources.items()):
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                name = node.func.attr
                if name in CLIENT_WRITES or (name in FLUENT_WRITES and _is_mlflow(node.func.value)):
                    found.append((where, node.lineno, name))
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mlflow"):
                for alias in node.names:
                    if alias.name in FLUENT_WRITES | CLIENT_WRITES:
                        found.append((where, node.lineno, alias.name))
    return [f"{where}:{line} {name}" for where, line, name in sorted(found)]


def _package_sources() -> dict[str, str]:
    paths = (p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
    return {str(p.relative_to(ROOT)): p.read_text() for p in paths if p != HOME}


def test_the_write_names_cover_what_the_project_writes():
    assert {
        "set_tag",
        "delete_tag",
        "log_metric",
        "log_batch",
        "log_param",
        "log_text",
        "log_artifact",
        "log_artifacts",
        "create_run",
        "update_run",
        "delete_run",
        "set_terminated",
        "create_experiment",
        "set_experiment_tag",
    } <= CLIENT_WRITES
    assert {"log_metrics", "log_params", "set_tags", "start_run", "end_run"} <= FLUENT_WRITES
    assert not CLIENT_WRITES & {"get_run", "search_runs", "get_metric_history"}


def test_every_mlflow_write_is_made_in_tracking_py():
    found = writes_outside_home(_package_sources())
    assert not found, "MLflow writes outside records/tracking.py:\n" + "\n".join(found)


def test_a_planted_write_is_caught():
    planted = {
        "sweeper/planted.py": "client.set_tag(run_id, 'k', 'v')\n"
        "tracking_client(uri).log_artifacts(run_id, out, 'analysis')\n"
        "mlflow.log_metrics({'a': 1.0})\n"
        "from mlflow import log_param\n",
        "analysis/clean.py": "run = MLflowRun.existing(run_id)\n"
        "run.set_tags({'k': 'v'})\n"
        "run.log_metrics(0, {'a': 1.0})\n"
        "run.save_text('x', 'x.txt')\n"
        "x = client.get_run(run_id).info.status\n",
    }
    assert writes_outside_home(planted) == [
        "sweeper/planted.py:1 set_tag",
        "sweeper/planted.py:2 log_artifacts",
        "sweeper/planted.py:3 log_metrics",
        "sweeper/planted.py:4 log_param",
    ]
