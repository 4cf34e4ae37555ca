"""The link that opens a study's runs in the MLflow UI (analysis/mlflow_ui.py): built from
hand-written inputs, printed by a real sweep and by `python -m analysis report`, and rendered
by a real `mlflow ui` in headless Chromium (MLflow 3.17 opens an empty GenAI overview on the
experiment's bare address; the link must show the trial runs and their columns)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import unquote

import pytest
from conftest import (
    RUNS_SWEEP,
    free_port,
    mlflow_uri,
    needs_chromium,
    rendered_dom,
    study_in,
    study_uri,
)
from mlflow.tracking import MlflowClient

from analysis.__main__ import main
from analysis.mlflow_ui import (
    VIEW_TAG_PREFIX,
    runs_view_url,
    ui_command,
    view_facets,
    view_key,
    view_state,
)

ATTRS = {
    "objective": "eval/reward/mean",
    "direction": "maximize",
    "seeds": 1,
    "search_space": {"lr": "1e-3,2e-3", "group_size": "2,4"},
}


def test_a_server_link_is_on_the_server_itself() -> None:
    url = runs_view_url("http://mlflow-host:5000/", "7", view_key="sweep-s1")
    assert url == (
        "http://mlflow-host:5000/#/experiments/7/runs"
        "?workflowType=machine_learning&viewStateShareKey=sweep-s1"
    )
    assert ui_command("http://mlflow-host:5000") is None
    assert runs_view_url("https://h/mlflow", "3").startswith("https://h/mlflow/#/experiments/3/")


def test_a_database_store_links_to_mlflow_uis_default_address_and_says_how_to_serve_it() -> None:
    uri = "sqlite:////home/me/work/mlflow.db"
    assert runs_view_url(uri, "1") == (
        "http://127.0.0.1:5000/#/experiments/1/runs?workflowType=machine_learning"
    )
    assert ui_command(uri) == "mlflow ui --backend-store-uri sqlite:////home/me/work/mlflow.db"
    assert ui_command("/tmp/my runs") == "mlflow ui --backend-store-uri '/tmp/my runs'"
    masked = ui_command("postgresql://user:secret@db/mlflow")
    assert masked == "mlflow ui --backend-store-uri 'postgresql://user:***@db/mlflow'"


def test_facets_pick_the_studys_trial_runs_best_first() -> None:
    facets = view_facets("s1", ATTRS)
    assert facets == {
        "searchFilter": "tags.`sweeper.study` = 's1' AND tags.`sweeper.role` = 'trial'",
        "orderByKey": "metrics.`eval/reward/mean`",
        "orderByAsc": False,
    }
    url = runs_view_url("sqlite:///x.db", "1", facets=facets)
    assert "&orderByAsc=false" in url and " " not in url
    assert unquote(url).endswith(
        "searchFilter=tags.`sweeper.study` = 's1' AND tags.`sweeper.role` = 'trial'"
        "&orderByKey=metrics.`eval/reward/mean`&orderByAsc=false"
    )
    several = view_facets("it's", {**ATTRS, "seeds": 3, "direction": "minimize"})
    assert several["searchFilter"] == (
        "tags.`sweeper.study` = 'it\\'s' AND tags.`sweeper.role` = 'config'"
    )
    assert several["orderByKey"] == "metrics.`objective/mean`" and several["orderByAsc"] is True


def test_the_view_shows_the_objective_its_interval_the_params_and_the_outcome() -> None:
    assert view_state("s1", ATTRS)["selectedColumns"] == [
        "metrics.`eval/reward/mean`",
        "metrics.`objective/ci95_low`",
        "metrics.`objective/ci95_high`",
        "metrics.`seeds/ended`",
        "params.`lr`",
        "params.`group_size`",
        "tags.`sweeper.state`",
    ]
    assert view_key("grpo-97a6b839") == "sweep-grpo-97a6b839"
    odd = view_key("my study/2")
    assert odd.startswith("sweep-my-study-2-") and odd != view_key("my study 2")


# --- a real sweep -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def swept(shared_sweep) -> tuple[Path, str]:
    """A tiny real sweep (the session's shared one): (its folder, its stdout)."""
    done = shared_sweep(*RUNS_SWEEP)
    return done.cwd, done.stdout


def _link(text: str) -> str:
    (line,) = [x for x in text.splitlines() if x.startswith("MLflow runs: ")]
    return line.removeprefix("MLflow runs: ")


@pytest.mark.slow
def test_the_sweep_ends_with_the_link_to_its_view(swept) -> None:
    cwd, out = swept
    study = study_in(cwd).study_name
    client = MlflowClient(mlflow_uri(cwd))
    experiment = client.get_experiment_by_name("grpo")
    assert _link(out) == (
        f"http://127.0.0.1:5000/#/experiments/{experiment.experiment_id}/runs"
        f"?workflowType=machine_learning&viewStateShareKey=sweep-{study}"
    )
    assert f"(serve them first: mlflow ui --backend-store-uri {mlflow_uri(cwd)})" in out
    assert out.index("Next: ") < out.index("MLflow runs: ")  # after the verdict
    saved = json.loads(experiment.tags[f"{VIEW_TAG_PREFIX}sweep-{study}"])
    assert saved["name"] == f"sweep {study}"
    state = json.loads(saved["state"])
    # its seeds raced: a configuration's run holds the mean over its seeds (the hand-made
    # one-seed view is test_the_view_shows_the_objective_its_interval_the_params_and_the_outcome)
    assert state["selectedColumns"] == [
        "metrics.`objective/mean`",
        "metrics.`objective/ci95_low`",
        "metrics.`objective/ci95_high`",
        "metrics.`seeds/ended`",
        "params.`lr`",
        "tags.`sweeper.state`",
    ]
    rows = client.search_runs([experiment.experiment_id], state["searchFilter"])
    assert sorted(r.info.run_name for r in rows) == ["t0 lr=0.001", "t1 lr=0.002"]


@pytest.mark.slow
def test_the_report_prints_the_same_link(swept, capsys, tmp_path) -> None:
    cwd, out = swept
    report = ["report", "--storage", study_uri(cwd), "--out", str(tmp_path / "report")]
    assert main(report) == 0
    assert _link(capsys.readouterr().out) == _link(out)
    assert main([*report, "--no-mlflow-log"]) == 0  # writes nothing: the rows, no columns
    link = unquote(_link(capsys.readouterr().out))
    assert "viewStateShareKey" not in link and "orderByKey=metrics.`objective/mean`" in link


@pytest.mark.slow
@needs_chromium
def test_the_link_shows_the_trial_runs_in_a_real_mlflow_ui(swept, tmp_path) -> None:
    cwd, out = swept
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", mlflow_uri(cwd)]
        + ["--port", str(port)],
        cwd=tmp_path,  # the sweep's folder is shared: the server writes nothing there
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_for(f"{base}/health", server)
        link = _link(out).replace("http://127.0.0.1:5000", base)
        dom = _dom(link, tmp_path / "chrome-link")
        assert "t0 lr=0.001" in dom and "t1 lr=0.002" in dom, dom[-2000:]
        assert "sweeper.state" in dom and "COMPLETE" in dom  # the view's columns
        experiment = link.split("/runs?")[0]  # the bare address: MLflow's GenAI overview
        assert "t0 lr=0.001" not in _dom(experiment, tmp_path / "chrome-bare")
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # mlflow ui and the server it started
        server.wait(timeout=30)


def _wait_for(url: str, server: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.poll() is None, "mlflow ui exited"
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"{url} did not answer in {timeout_s} s")


def _dom(url: str, profile: Path) -> str:
    return rendered_dom(url, profile, 20000, 180, "--window-size=1600,1000")
