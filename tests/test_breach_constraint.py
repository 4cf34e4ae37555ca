"""A trial pruned by a health rule is told to Optuna as infeasible (a constraint), so TPE and
GP rank it after every run that did not break instead of scoring its early eval."""

from __future__ import annotations

import pytest
from conftest import run_sweep, study_in

from records.sweep import BREACH_CONSTRAINT

pytestmark = pytest.mark.slow


def test_a_health_pruned_trial_is_recorded_infeasible(tmp_path):
    tiny = ["max_steps=3", "batch_size=4", "task.eval_size=16", "eval_every=2"]
    done = run_sweep(tmp_path, "lr=1e-3,0.5", *tiny)
    assert done.returncode == 0, done.stderr[-3000:]
    by_lr = {t.params["lr"]: t for t in study_in(tmp_path).trials}
    assert by_lr[0.5].state.name == "PRUNED" and "prune_reason" in by_lr[0.5].user_attrs
    assert by_lr[0.5].constraints == {BREACH_CONSTRAINT: 1.0}
    assert by_lr[0.001].state.name == "COMPLETE" and by_lr[0.001].constraints == {}
