"""Before its first trial a sweep says when its eval is too small to tell configurations apart,
and at its first baseline when every completion hit max_tokens: once a sweep, one line each;
its verdict's next step then names the cause. A real sweep of the tiny model on a 4-problem
eval, max_tokens=1."""

import subprocess
import sys
from pathlib import Path

from conftest import ONE_SEED, run_sweep, sweep_env

from judge.stats import LOOKED_FOR, WIDEST_SD, detectable_difference, problems_to_detect

EVAL_TOO_SMALL = (
    "Eval too small: 4 problems tell apart only gaps of 0.69+ (task.eval_size=49 tells 0.2)"
)
TRUNCATED = (
    "every completion of the baseline eval hit max_tokens=1 before it ended: the rewards "
    "score cut-off answers, so the sweep can learn little about its settings: raise max_tokens"
)
NEXT_TRUNCATED = (
    "Next: raise max_tokens (every baseline completion hit max_tokens); seeds will not help."
)


def test_the_detectable_difference_and_the_problems_it_takes():
    assert round(detectable_difference(WIDEST_SD, 4), 3) == 0.693  # 1.96 x 0.5 x sqrt(2/4)
    assert problems_to_detect(LOOKED_FOR, WIDEST_SD) == 49
    assert detectable_difference(WIDEST_SD, 49) <= LOOKED_FOR < detectable_difference(0.5, 48)


def test_a_sweep_says_what_it_cannot_learn_before_it_spends_compute(tmp_path: Path):
    args = ["lr=1e-3,2e-3", "task.eval_size=4", "max_tokens=1", "max_steps=2", "eval_every=2"]
    done = subprocess.run(
        [sys.executable, "-m", "sweeper", "-m", *args, "batch_size=4", "group_size=2", ONE_SEED],
        cwd=tmp_path,
        env=sweep_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # Hydra's log lines on stdout, the sweep's on stderr: in order
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    lines = done.stdout.splitlines()
    said = [i for i, line in enumerate(lines) if line.endswith(EVAL_TOO_SMALL)]
    first_trial = next(i for i, line in enumerate(lines) if line.endswith("t0 lr=0.001 started"))
    assert len(said) == 1 and said[0] < first_trial  # before the first trial
    truncated = [i for i, line in enumerate(lines) if line.endswith(TRUNCATED)]
    second_trial = next(i for i, line in enumerate(lines) if "t1 lr=0.002 started" in line)
    assert len(truncated) == 1 and first_trial < truncated[0] < second_trial  # t0's baseline
    # and the verdict's next step names it, from what each trial recorded, not more seeds
    assert NEXT_TRUNCATED in lines, done.stdout[-3000:]


def test_a_large_enough_eval_says_nothing(tmp_path: Path):
    done = run_sweep(
        tmp_path,
        "lr=1e-3",
        "task.eval_size=49",
        "max_steps=1",
        "eval_every=1",
        "batch_size=4",
        "group_size=2",
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Eval too small" not in done.stderr
    assert "hit max_tokens" not in done.stderr


def test_a_data_file_too_small_says_how_many_rows_would_tell():
    """task=jsonl holds out a share of its rows: the line names the share that would tell, or
    that the file itself is too small (issue 74's walk: 40 rows, 4 held out)."""
    from omegaconf import OmegaConf

    from sweeper.plan.eval_power import eval_size_warning

    jsonl = OmegaConf.create({"eval_fraction": 0.1, "eval_split": None})
    assert eval_size_warning(jsonl, 4, "eval/reward/mean", 0.2) == (
        "Eval too small: 4 problems tell apart only gaps of 0.69+ "
        "(0.2 takes 49 held-out rows; the file holds about 40)"
    )
    assert eval_size_warning(jsonl, 40, "eval/reward/mean", 0.2) == (
        "Eval too small: 40 problems tell apart only gaps of 0.22+ "
        "(task.eval_fraction=0.12, about 49 of 400 rows, tells 0.2)"
    )
