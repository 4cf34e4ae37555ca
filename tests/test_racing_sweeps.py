"""Racing seeds (hydra.sweeper.seeds=auto) on real sweeps. The objective is the logged `lr`,
the same for every seed of a configuration, so the race's decisions are known in advance:
the largest lr leads and is separated from every other after 2 seeds each (zero spread)."""

from __future__ import annotations

import collections
import signal
import subprocess

import pytest
from conftest import run_sweep, start_sweep, study_in
from mlflow.tracking import MlflowClient

from records.sweep import replicates

pytestmark = pytest.mark.slow

TINY = ["max_steps=1", "batch_size=4", "group_size=2", "task.eval_size=8", "eval_every=0"]
RACE = ["hydra.sweeper.seeds=auto", "hydra.sweeper.health=[]", *TINY]
BY_LR = ["hydra.sweeper.objective=lr", *RACE]


def _training_runs(cwd):
    """(lr, seed) -> the number of completed training runs MLflow holds for it."""
    client = MlflowClient(f"sqlite:///{cwd}/mlflow.db")
    found = client.search_runs([client.get_experiment_by_name("grpo").experiment_id])
    return collections.Counter(
        (r.data.params["lr"], r.data.params["seed"])
        for r in found
        if r.data.tags.get("sweeper.role") == "trial"
        and r.data.tags.get("sweeper.state") == "COMPLETE"
    )


def test_a_configuration_tied_with_a_racing_leader_waits_until_the_leader_is_told(tmp_path):
    # The objective is the lr, which both share: tied exactly, and t0 leads (the first by
    # label). t0 holds after its 2 seeds, leading the known ones while t1 is to come; t1's tie
    # is judged against t0 still open, so t1 holds too (judge/race.py _stop_or_wait) and is told
    # only after t0. Without the wait, t1 would be told first, at its own look.
    done = run_sweep(tmp_path, "kl_discount_factor=0.0,0.5", *BY_LR)
    assert done.returncode == 0, done.stderr[-3000:]
    t0, t1 = sorted(study_in(tmp_path).trials, key=lambda t: t.number)
    assert [len(replicates(t)) for t in (t0, t1)] == [2, 2]
    assert t0.user_attrs["race"].startswith("tied with t1 after 2 seeds")
    assert t1.user_attrs["race"].startswith("tied with t0 after 2 seeds")  # re-judged, told
    assert t0.datetime_complete < t1.datetime_complete
    ended = [line.split("] ")[1] for line in done.stderr.splitlines() if "; tied with" in line]
    assert [line[:3] for line in ended] == ["t0 ", "t1 "]  # end lines, in the order told
    assert sum(_training_runs(tmp_path).values()) == 4
    assert "Tied at this sample size" in done.stdout


def test_a_race_interrupted_midway_continues_and_eliminates_with_the_verdict_saying_why(tmp_path):
    """The objective is the lr: 3e-3 leads and is separated from every other after 2 seeds
    each. Stopped while t1 runs, the same command carries t0's seeds over and ends the race
    as an uninterrupted one would: 2 seeds each, the others eliminated, and a verdict, its
    cost and MLflow saying so."""
    args = ["lr=1e-3,2e-3,3e-3", *BY_LR]
    sweep = start_sweep(tmp_path, *args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    for line in sweep.stderr:  # t0 has run its 2 seeds and holds; t1 is under way
        if "t1 lr=0.002 started" in line:
            sweep.send_signal(signal.SIGTERM)
            break
    sweep.stderr.read()
    assert sweep.wait(timeout=120) != 0
    first = study_in(tmp_path).trials
    kept = {r.run_id for t in first if t.params.get("lr") == 0.001 for r in replicates(t)}
    assert len(kept) == 2  # t0's two seeds completed before the stop
    done = run_sweep(tmp_path, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = {t.params["lr"]: t for t in study_in(tmp_path).trials}
    assert all(t.state.name == "COMPLETE" for t in trials.values())
    assert {r.run_id for r in replicates(trials[0.001])} == kept  # carried over, not run again
    for lr, t in trials.items():  # 2 seeds each, no more: the race was over after them
        assert [r.seed for r in replicates(t)] == [0, 1], lr
    assert trials[0.003].user_attrs["race"] == "separated from every other after 2 seeds"
    for lr in (0.001, 0.002):
        assert (
            trials[lr]
            .user_attrs["race"]
            .startswith(f"eliminated after 2 seeds: t{trials[0.003].number} is better by")
        )
    assert set(_training_runs(tmp_path).values()) == {1}  # each (configuration, seed) once
    assert len(_training_runs(tmp_path)) == 6
    # the decision first, then each configuration's race in the table's note
    assert "beat every other" in done.stdout or "is the best;" in done.stdout
    assert "eliminated after 2 seeds" in done.stdout
    # what it cost: 6 runs of 1 step, where 3 seeds of each would have taken 9, with the
    # health rules (nothing pruned; each third seed estimated at 1 step) or without
    assert (
        "Cost: 6 training steps in 6 runs, 67% of the 9 a 3-seed grid takes, health rules or "
        "not (3 estimated)." in done.stdout
    )
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run = client.get_run(trials[0.001].user_attrs["mlflow_run_id"])  # the configuration's run
    assert run.data.tags["sweeper.race"] == trials[0.001].user_attrs["race"]


def test_two_workers_racing_one_study_run_each_seed_of_each_configuration_once(tmp_path):
    args = ["lr=1e-3,2e-3,3e-3,4e-3", *BY_LR]
    workers = [
        start_sweep(tmp_path, *args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(2)
    ]
    outputs = [w.communicate(timeout=600)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    trials = study_in(tmp_path).trials
    assert sorted(t.params["lr"] for t in trials) == [0.001, 0.002, 0.003, 0.004]
    assert all([r.seed for r in replicates(t)] == [0, 1] for t in trials)
    runs = _training_runs(tmp_path)
    assert len(runs) == 8 and set(runs.values()) == {1}


def test_a_reward_part_objective_records_its_stderr_and_per_problem_rewards(tmp_path):
    """Ranked on one reward (correctness, where the total can be gamed), a seed's record
    carries that reward's stderr and per-problem values: racing's min_difference (the eval's
    stderr) and the verdict's pairing over problems read them, and were 0 and absent before."""
    done = run_sweep(
        tmp_path,
        "lr=1e-3",
        "task=addition_length",
        "hydra.sweeper.objective=eval/reward/exact_match",
        "hydra.sweeper.health=[]",
        *TINY,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (trial,) = study_in(tmp_path).trials
    (seed,) = replicates(trial)
    assert len(seed.per_problem) == 8 and all(v in (0.0, 1.0) for v in seed.per_problem)
    p = sum(seed.per_problem) / 8
    assert seed.value == pytest.approx(p)
    assert seed.stderr == pytest.approx((p * (1 - p) * 8 / 7 / 8) ** 0.5)  # sample sd / sqrt(8)
