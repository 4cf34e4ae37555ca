"""Every MLflow link the project prints or writes opens on the model-training pages
(`workflowType=machine_learning`), every run of a sweep says which metric is its objective,
and each configuration's run carries the verdict's interval and seeds for the study's view.
A real tiny sweep (2 configurations x 2 seeds) in a real SQLite MLflow store."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import RUNS_SWEEP, mlflow_uri, study_in, study_uri, verdict_decision
from mlflow.tracking import MlflowClient
from test_trainer_cli import run_trainer

from analysis.__main__ import main
from analysis.mlflow_ui import run_url
from analysis.verdict import study_verdict
from records.sweep import ConfigMetric, Role, Tag, TrialAttr

LINK = re.compile(r"https?://\S+#/experiments/\S+")


def test_a_run_link_opens_the_model_training_run_page() -> None:
    assert run_url("sqlite:////w/mlflow.db", "3", "ab12") == (
        "http://127.0.0.1:5000/#/experiments/3/runs/ab12?workflowType=machine_learning"
    )
    assert run_url("http://host:5000/", "3", "ab12").startswith("http://host:5000/#/")


@pytest.fixture(scope="module")
def swept(shared_sweep) -> tuple[Path, str]:
    done = shared_sweep(*RUNS_SWEEP)
    return done.cwd, done.stdout + done.stderr


def test_every_printed_and_written_link_is_on_the_model_training_pages(
    swept, capsys, tmp_path
) -> None:
    cwd, printed = swept
    report = ["report", "--storage", study_uri(cwd), "--out", str(tmp_path / "report")]
    assert main(report) == 0
    printed += capsys.readouterr().out
    assert "Logged to MLflow run http://127.0.0.1:5000/#/experiments/" in printed
    client = MlflowClient(mlflow_uri(cwd))
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    written = " ".join(r.data.tags.get("mlflow.note.content", "") for r in runs)
    links = LINK.findall(printed) + LINK.findall(written)
    assert len(links) >= 3 + len(runs)  # the sweep's, the report's two, one a run
    assert [u for u in links if "workflowType=machine_learning" not in u] == []


def test_every_run_names_its_objective(swept) -> None:
    cwd, _ = swept
    client = MlflowClient(mlflow_uri(cwd))
    study = study_in(cwd).study_name
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        filter_string=f"tags.`{Tag.STUDY}` = '{study}'",
    )
    roles = sorted(r.data.tags[Tag.ROLE] for r in runs)
    assert roles == [Role.CONFIG] * 2 + [Role.STUDY] + [Role.TRIAL] * 4
    for run in runs:
        assert run.data.tags[Tag.OBJECTIVE] == "eval/reward/mean"
        note = run.data.tags["mlflow.note.content"]
        objective = "**Objective: `eval/reward/mean`** (held-out reward): the value the sweep ranks"
        if run.data.tags[Tag.ROLE] == Role.STUDY:  # the verdict and its statistics come first
            assert note.startswith(f"**Verdict:** {verdict_decision(swept[1])}"), note
            assert objective in note, note
        else:
            assert note.startswith(objective), note
        assert f"viewStateShareKey=sweep-{study})" in note


def test_each_configuration_run_holds_the_verdicts_interval_and_seeds(swept) -> None:
    cwd, _ = swept
    client = MlflowClient(mlflow_uri(cwd))
    study = study_in(cwd)
    verdict = study_verdict(study, study.user_attrs, maximize=True)
    trials = {f"t{t.number}": t for t in study.trials}
    assert len(verdict.ranked) == 2
    for summary in verdict.ranked:
        run_id = trials[summary.label].user_attrs[TrialAttr.MLFLOW_RUN_ID]
        metrics = client.get_run(run_id).data.metrics
        assert metrics[ConfigMetric.SEEDS_ENDED] == 2
        assert metrics[ConfigMetric.CI_LOW] == pytest.approx(summary.interval.low)
        assert metrics[ConfigMetric.CI_HIGH] == pytest.approx(summary.interval.high)


def test_a_training_run_ends_with_its_page_on_the_model_training_pages(tmp_path: Path) -> None:
    done = run_trainer(
        tmp_path, "max_steps=1", "eval_every=1", "batch_size=4", "group_size=2", "task.eval_size=8"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = MlflowClient(mlflow_uri(tmp_path)).search_runs(["1"])
    assert done.stdout.rstrip().endswith(
        f"; MLflow run http://127.0.0.1:5000/#/experiments/1/runs/{run.info.run_id}"
        "?workflowType=machine_learning"
    )
