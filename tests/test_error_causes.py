"""Errors name their cause: a key of another option of its group says which option to select,
and an error every point of the grid shares names no point. Real CLI runs, one line each:
`python -m sweeper` and `python -m trainer` alike, from the same check."""

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import sweep_env

ROWS = [
    (
        ["task.path=problems.jsonl"],
        "error: task.path=problems.jsonl: task.path is a setting of task=jsonl: add task=jsonl",
    ),
    (
        ["task.max_operand=5", "lr=1e-3,2e-3"],
        "error: task.max_operand=5: task.max_operand is a setting of task=arithmetic: "
        "add task=arithmetic",
    ),
    (
        ["model.path=/no/such/model", "lr=1e-4"],
        "error: model.path='/no/such/model': must be a Hugging Face model directory that exists",
    ),
    (
        ["model.path=/no/such/model", "lr=1e-4,2e-4"],
        "error: model.path='/no/such/model': must be a Hugging Face model directory that exists",
    ),
    (  # only the second point is wrong: the point is named
        ["temperature=0.7,0"],
        "error: temperature=0.0: must be in (0, 10); 0.6-1.0 is typical (at temperature=0)",
    ),
]


@pytest.mark.parametrize(("args", "line"), ROWS, ids=[" ".join(a) for a, _ in ROWS])
def test_the_error_names_the_cause_in_one_line(tmp_path: Path, args, line):
    done = subprocess.run(
        [sys.executable, "-m", "sweeper", "-m", *args],
        cwd=tmp_path,
        env=sweep_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr == line + "\n"
    assert not (tmp_path / "sweeps.db").exists()  # before any study exists


# `python -m trainer` asks the same check as the sweeper (trainer/base/known_keys.py), before
# Hydra, which would print its own six lines, or train on with `+lrr` read by nothing.
TRAINER_ROWS = [
    (
        ["task.path=problems.jsonl"],
        "error: task.path=problems.jsonl: task.path is a setting of task=jsonl: add task=jsonl",
    ),
    (
        ["task.max_operand=5"],
        "error: task.max_operand=5: task.max_operand is a setting of task=arithmetic: "
        "add task=arithmetic",
    ),
    (["lrr=1e-3"], "error: lrr=1e-3: no such setting (closest: lr)"),
    (["+lrr=1e-3"], "error: +lrr=1e-3: nothing reads lrr (closest: lr)"),
]


@pytest.mark.parametrize(("args", "line"), TRAINER_ROWS, ids=[" ".join(a) for a, _ in TRAINER_ROWS])
def test_the_trainer_names_the_cause_in_the_same_line(tmp_path: Path, args, line):
    done = subprocess.run(
        [sys.executable, "-m", "trainer", *args],
        cwd=tmp_path,
        env=sweep_env(tmp_path, store=False),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr == line + "\n"
    assert not list(tmp_path.iterdir())  # no MLflow store, no outputs/ folder: nothing ran
