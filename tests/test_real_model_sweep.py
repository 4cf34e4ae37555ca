"""`python -m sweeper -m lr=...` on a real instruct model and the arithmetic task, end to end:
the chat template on, the last-number reward, both trials complete, the verdict and the
report written (bench/REAL_TASKS.md has the full-size run)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import run_sweep, study_in, sweep_env

from analysis.records import TrialAttr

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_a_sweep_over_lr_on_smollm2_runs_end_to_end_with_its_report(smollm2, tmp_path):
    done = run_sweep(
        tmp_path, f"model.path={smollm2}", "task=arithmetic", "task.eval_size=32",
        "lr=3e-4,1e-3", "batch_size=2", "group_size=2", "max_tokens=12", "temperature=0.7", "max_steps=2",
        "eval_every=0", "hydra.sweeper.study_name=smollm2-lr",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # learner_batch_tokens=auto sized from the model
    assert "micro-batches of at most 970 tokens" in done.stdout + done.stderr
    trials = study_in(tmp_path).trials
    assert sorted(t.params["lr"] for t in trials) == [3e-4, 1e-3]
    assert {t.state.name for t in trials} == {"COMPLETE"}
    baselines = [t.user_attrs[TrialAttr.BASELINE] for t in trials]
    assert all(b > 0 for b in baselines)  # the template and the reward read its answers
    report = subprocess.run(
        [sys.executable, "-m", "analysis", "report"],
        cwd=tmp_path, env=sweep_env(tmp_path), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr[-3000:]
    assert "Study smollm2-lr" in report.stdout and "t0" in report.stdout
    assert (tmp_path / "reports" / "smollm2-lr" / "index.html").is_file()
