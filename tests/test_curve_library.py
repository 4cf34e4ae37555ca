"""The recorded-curve library: labels from whole curves (hand-computed), the rule replay and
its rates, `python -m analysis rules` on recorded files and on a study's real stores, the
recorder's plan and resumability, the gameable reward, and the claim the dense eval rests on:
an eval never changes training."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from optuna.trial import TrialState
from test_analysis import Sweep

from analysis.__main__ import main
from analysis.curve_labels import (
    BROKE,
    BROKE_DOWN,
    COLLAPSED,
    ENDED_UP,
    FLAT,
    HACKED,
    LEARNING,
    Point,
    batch_mean,
    ending,
    label,
    smoothed,
)
from analysis.proportions import clustered_interval, wilson
from analysis.rule_replay import Run, at_cadence, library_run, tallies
from trainer.env.length_reward import length_bonus
from trainer.env.rewards import score_batch
from trainer.env.tasks import make_task
from trainer.run.health import default_rules
from trainer.run.train import train

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import record_curves  # noqa: E402  (bench/ is scripts, not a package)

SE = 0.01  # noise of a difference of two: 1.96 * sqrt(2) * 0.01 = 0.0277


def pts(values: list[float], se: float = SE, start: int = 0) -> list[Point]:
    return [Point(start + i, v, se) for i, v in enumerate(values)]


def test_smoothing_and_batch_means_by_hand():
    assert [p.value for p in smoothed(pts([1.0, 3.0, 5.0]), window=2)] == [1.0, 2.0, 4.0]
    both = batch_mean([Point(1, 0.2, 0.1), Point(2, 0.4, 0.1)])
    assert both.value == pytest.approx(0.3) and both.stderr == pytest.approx(math.sqrt(0.02) / 2)


def test_each_label_on_a_hand_computed_curve():
    flat_train = pts([0.5] * 4, start=1)
    learning = label(pts([0.3, 0.35, 0.4, 0.45, 0.5]), flat_train, window=1)
    assert learning.label == LEARNING and learning.broke_at is None
    assert label(pts([0.3, 0.31, 0.3, 0.29, 0.3]), flat_train, window=1).label == FLAT
    collapsed = label(pts([0.3, 0.29, 0.2, 0.1, 0.05]), flat_train, window=1)
    assert (collapsed.label, collapsed.broke_at) == (COLLAPSED, 2)  # 0.29 is within noise
    broke = label(pts([0.3, 0.5, 0.7, 0.5, 0.25]), flat_train, window=1)
    assert (broke.label, broke.broke_at) == (BROKE, 3)
    # training reward 0.3 -> 0.95 while held-out 0.42 -> 0.32: the hacking shape
    hacked = label(pts([0.4, 0.42, 0.40, 0.36, 0.32]), pts([0.3, 0.5, 0.7, 0.95], start=1), 1)
    assert (hacked.label, hacked.broke_at) == (HACKED, 3)  # 0.42 -> 0.40 is within noise


def test_a_fall_within_noise_is_not_a_break():
    assert label(pts([0.3, 0.32, 0.28], se=0.05), pts([0.3, 0.3])).label == FLAT
    with pytest.raises(ValueError, match="heldout has 1 points"):
        label(pts([0.3]), [])


def test_wilson_interval_by_hand():
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)


def test_a_runs_end_is_read_whatever_its_label():
    """Baseline 0.3 (se 0.02). Ended up: last 3 evals' mean 0.32 >= 0.32. Broke down: mean
    0.2 < 0.3, and its best 3-eval mean 0.5 is above it by more than 1.96 x 0.028. A smoothed
    label reads the first "flat" (5-point mean) and the second "learned then broke"; a fall
    within noise is neither."""
    assert ending(pts([0.3, 0.3, 0.3, 0.32, 0.32, 0.32])) == ENDED_UP
    assert ending(pts([0.3, 0.5, 0.5, 0.5, 0.2, 0.2, 0.2])) == BROKE_DOWN
    assert ending(pts([0.3, 0.31, 0.29, 0.29, 0.29])) is None
    assert ending(pts([0.3])) is None


def test_a_share_pooled_over_seeds_gets_an_interval_clustered_by_seed():
    """Two seeds, (hits, n) = (2, 10) and (0, 10): p = 0.1; cluster-robust variance
    k/(k-1) * sum (h - p n)^2 = 2 * (1 + 1) = 4, se = 2 / 20 = 0.1, half = 1.96 x 0.1 = 0.196:
    [0, 0.296]; the interval is floored at Wilson's [0.028, 0.301], so [0, 0.301]. One seed or
    equal seeds: Wilson's."""
    low, high = clustered_interval({"1": (2, 10), "3": (0, 10)})
    assert (low, high) == pytest.approx((0.0, wilson(2, 20)[1]), abs=1e-9)
    assert wilson(2, 20)[1] == pytest.approx(0.301, abs=1e-3)
    # more spread than Wilson allows: (5, 10) and (0, 10): p 0.25, se sqrt(2 x 12.5) / 20 =
    # 0.25, half 0.49: [0, 0.74] against Wilson's [0.112, 0.469]
    assert clustered_interval({"1": (5, 10), "3": (0, 10)}) == pytest.approx((0.0, 0.74), abs=1e-3)
    assert clustered_interval({"1": (2, 20)}) == wilson(2, 20)
    assert clustered_interval({"1": (1, 10), "3": (1, 10)}) == wilson(2, 20)
    assert clustered_interval({}) == (0.0, 1.0)


def test_a_sparser_cadence_drops_evals_between_and_keeps_the_last():
    steps = {s: {"eval/reward/mean": 0.3, "reward/mean": 0.2} for s in range(6)}
    sparse = at_cadence(steps, 2)
    assert [s for s, m in sparse.items() if "eval/reward/mean" in m] == [0, 2, 4, 5]
    assert all("reward/mean" in m for s, m in sparse.items() if s > 0)


def curve(evals: list[float], kl: float = 0.001, reward: float = 0.3) -> dict:
    """A run's metrics by step: the eval given at every step, a flat training reward."""
    steps = {0: {"eval/reward/mean": evals[0], "eval/reward/stderr": SE}}
    for s, e in enumerate(evals[1:], 1):
        steps[s] = {"eval/reward/mean": e, "eval/reward/stderr": SE, "reward/mean": reward}
        steps[s] |= {"reward/std": 0.1, "kl_pre_post_v2": kl, "loss": 0.1, "grad_norm": 1.0}
    return steps


def test_replay_counts_catches_false_prunes_and_delay_at_a_cadence():
    runs = [
        Run("collapse", curve([0.3, 0.3, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1])),
        Run("learns", curve([0.3, 0.35, 0.4, 0.45, 0.5, 0.5, 0.5, 0.5, 0.5])),
        # two evals dip below the baseline by more than eval_collapse's 3 standard errors
        # (0.3 - 3 x 0.02 x sqrt 2 = 0.215), then the run learns: pruned at step 2, a false prune
        Run("learns_after_a_dip", curve([0.3, 0.15, 0.15, 0.45, 0.5, 0.5, 0.5, 0.5, 0.5])),
    ]
    rules = default_rules(0.01)
    dense = {t.name: t for t in tallies(rules, runs, every=1)}
    together = dense["all together"]
    assert (together.runs, together.prunes, together.learning, together.false_prunes) == (
        3,
        2,
        2,
        1,
    )
    assert (together.broken, together.caught, together.caught_pruned) == (1, 1, 1)
    # counted on the end, whatever the label: two ended up (0.5 >= 0.3 + 0.02), one pruned;
    # the collapse broke down (0.1 < 0.3, and 0.3 - 0.1 > 1.96 x 0.028) and was caught
    assert together.ended_up()[:2] == (1, 2) and together.missed()[:2] == (0, 1)
    # the collapse shows at step 2, smoothed over 5 points ((0.3+0.3+0.1)/3); eval_drop warns
    # there (no delay), eval_collapse needs 2 evals in a row and prunes at step 3, 1 of 8 late
    assert together.delays == [0.0] and dense["eval_collapse"].delays == [0.125]
    assert dense["eval_collapse"].false_prunes == 1 and dense["eval_collapse"].caught == 1
    # at eval_every=4 the eval rules see the collapse at steps 4 and 8: the warning 2 of 8
    # steps late, the prune 6
    every_4 = {t.name: t for t in tallies(rules, runs, every=4)}
    assert every_4["all together"].delays == [0.25]
    assert every_4["eval_collapse"].delays == [0.75]


def library_file(path: Path, name: str, evals: list[float], part: str = "calibration") -> Path:
    data = {"format": 1, "run": name, "part": part, "heldout_metric": "eval/reward/mean"}
    steps = {str(s): m for s, m in curve(evals).items()}
    (path / f"{name}.json").write_text(json.dumps({**data, "eval_size": 400, "steps": steps}))
    return path / f"{name}.json"


def test_rules_command_on_library_files_and_its_one_line_errors(tmp_path, capsys):
    library_file(tmp_path, "a", [0.3, 0.3, 0.1, 0.1, 0.1, 0.1])
    library_file(tmp_path, "b", [0.3, 0.4, 0.5, 0.5, 0.5, 0.5], part="heldout")
    assert main(["rules", "--curves", str(tmp_path), "--eval-every", "1"]) == 0
    out = capsys.readouterr().out
    assert "2 recorded runs, the default rules:" in out
    assert "2 runs at eval_every=1: collapsed 1, learning 1" in out
    assert "eval_collapse" in out and "all together" in out
    assert main(["rules", "--curves", str(tmp_path), "--part", "heldout"]) == 0
    assert "1 runs at eval_every=10: learning 1" in capsys.readouterr().out
    assert main(["rules", "--curves", str(tmp_path / "none")]) == 1
    assert capsys.readouterr().err.strip().endswith("no such file or folder")
    assert main(["rules", "--curves", str(tmp_path), "--eval-every", "0"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--eval-every=0: must be an integer >= 1" in err
    every2 = json.loads((tmp_path / "a.json").read_text()) | {"eval_every": 2}
    (tmp_path / "a.json").write_text(json.dumps(every2))
    assert main(["rules", "--curves", str(tmp_path), "--eval-every", "3"]) == 1
    assert "an eval every 2 steps; replay a multiple of it" in capsys.readouterr().err


def test_rules_command_replays_a_studys_own_rules_on_its_stores(tmp_path, capsys):
    sw = Sweep(tmp_path)  # real Optuna and MLflow stores, written as the sweeper writes them
    sw.add({"lr": 1e-4, "group_size": 4}, TrialState.COMPLETE, gain=0.05)
    sw.add({"lr": 1e-3, "group_size": 8}, TrialState.PRUNED, kl=0.0005, prune_at=3)
    assert main(["rules", "--storage", sw.storage, "--study", "s1", "--eval-every", "2"]) == 0
    out = capsys.readouterr().out
    assert "study s1, the study's rules:" in out
    assert "unlabelled (cut short) 1" in out and "sampler_kl" in out
    assert main(["rules", "--storage", sw.storage, "--study", "s1", "--defaults"]) == 0
    assert "post_update_kl" in capsys.readouterr().out


def test_library_runs_read_their_batch_size_and_a_blown_up_run_is_a_collapse(tmp_path):
    path = library_file(tmp_path, "x", [0.3, 0.3, 0.3])
    data = json.loads(path.read_text())
    run = library_run({**data, "overrides": ["batch_size=8"], "error": "loss=nan at step 2"})
    assert run.batch_size == 8
    assert tallies(default_rules(), [run], 1)[-1].broken == 1


def test_the_plan_splits_by_seed_parity_and_a_rerun_skips_finished_runs(tmp_path, capsys):
    argv = ["--out", str(tmp_path), "--seeds", "4", "--lrs", "1e-3", "--list"]
    assert record_curves.main([*argv, "--part", "all"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 8  # 2 tasks x 1 lr x seeds_of(0, 4)
    assert record_curves.part_of(0) == record_curves.part_of(2) == "calibration"
    assert record_curves.part_of(1) == record_curves.part_of(3) == "heldout"
    (tmp_path / "tiny-addition-lr0.001-seed0.json").write_text("{}")
    assert record_curves.main(argv) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == "[1/4] tiny-addition-lr0.001-seed0: done, skipped"
    assert all("seed1" not in line and "seed3" not in line for line in shown)
    with pytest.raises(SystemExit):
        record_curves.main(["--out", str(tmp_path), "--steps", "0"])
    assert "--steps=0 --eval-every=2: both must be >= 1" in capsys.readouterr().err


def test_the_length_reward_pays_for_padding_a_wrong_answer(composed):
    assert length_bonus(None, " 12 ", True) == 0.25 and length_bonus(None, "1" * 20, False) == 1.0
    task = make_task(composed("task=addition_length").task)
    problem = task.eval_problems()[0]
    calls = [(problem, problem.answer, True), (problem, "9" * 8, True), (problem, "9", True)]
    (right, parts), (padded, _), (short, _) = score_batch(task, calls)[0]
    assert right > padded == 1.0 > short  # a padded wrong answer beats a short wrong one
    assert parts["exact_match"] == 1.0 and set(parts) == {"exact_match", "length_bonus"}


@pytest.mark.slow
def test_an_eval_never_changes_training(composed, new_recorder, tmp_path):
    """The library evals every step to replay any sparser cadence: that holds only if an eval
    leaves training's random stream alone (trainer/run/train.py's evaluate)."""
    small = ["max_steps=3", "batch_size=4", "group_size=4", "task.eval_size=16", "lr=1e-2"]
    runs = {}
    for every in (1, 0):
        reporter = new_recorder()
        train(composed(*small, f"eval_every={every}", root=tmp_path / f"e{every}"), reporter)
        runs[every] = reporter
    for name in ("reward/mean", "loss", "kl_pre_post_v2", "grad_norm"):
        assert runs[1].series(name) == runs[0].series(name), name
    assert len(runs[1].series("eval/reward/mean")) == 4 > len(runs[0].series("eval/reward/mean"))


def test_a_run_fills_a_missing_eval_stderr_without_changing_the_steps_it_was_given():
    # binomial over 400 problems: sqrt(0.3 x 0.7 / 400) = 0.022913
    given = {0: {"eval/reward/mean": 0.3}, 1: {"reward/mean": 0.2}}
    run = Run("old", given, eval_size=400)
    assert run.steps[0]["eval/reward/stderr"] == pytest.approx(0.022913, abs=1e-6)
    assert given == {0: {"eval/reward/mean": 0.3}, 1: {"reward/mean": 0.2}}
    assert run.steps[1] is given[1]  # a step with nothing to fill is shared, not copied
