"""Packed sweeps (`hydra.sweeper.pack=K`, sweeper/sweep/packs.py) on the tiny model: real
`python -m sweeper -m` runs with their MLflow and Optuna stores. A packed trial is the trial
an unpacked sweep runs: its own MLflow run with the same curves, its own Optuna trial with the
same reports and outcome; one a health rule prunes and one that fails leave the pack alone;
SIGTERM stops every member and the same command resumes each from its own checkpoint. A
queued job takes the slot of a member that ended while the pack runs (one that cannot share
the pack's model runs after it; one whose config no longer composes, or whose setup raises
before its first step, fails alone).
`hydra.sweeper.pack=auto` packs the first test's small batch."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import mlflow_uri, run_sweep, start_sweep, study_in
from mlflow.tracking import MlflowClient

from records.sweep import State, TrialAttr, replicates

pytestmark = pytest.mark.slow

SHAPE = ["max_steps=3", "eval_every=0", "batch_size=2", "group_size=2", "task.eval_size=8"]
# The unpacked reference adds the adapter as PEFT's forward does, as the pack does
# (tests/test_packed_trials.py says why the merged default differs in the last bits).
SHAPE += ["sampler.merge_lora=false"]
# lr=1e-3 completes; lr=3e-2 is pruned by this rule after step 2; lr=1e30 fails at step 1 on
# its non-finite post-update KL (the rule reads lr only after step 2, so not it).
BIG_LR = "{name: big_lr, metric: lr, check: above, bound: 0.01, warmup_steps: 2}"
MIXED = ["lr=1e-3,3e-2,1e30", f"hydra.sweeper.health=[{BIG_LR}]", *SHAPE]
FLOAT32 = {"rel": 1.3e-6, "abs": 1e-5}  # torch.testing's float32 tolerances


def curves(cwd: Path) -> dict[float, tuple[str, dict[str, list]]]:
    """Each trial's MLflow run by its lr: its status and every metric's (step, value)s."""
    client = MlflowClient(mlflow_uri(cwd))
    found = {}
    for trial in study_in(cwd).trials:
        run = client.get_run(trial.user_attrs[TrialAttr.MLFLOW_RUN_ID])
        history = {
            key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
            for key in run.data.metrics
            if not key.startswith(("time/", "throughput/"))  # clocks differ, packed or not
        }
        found[trial.params["lr"]] = (run.info.status, history)
    return found


def outcomes(cwd: Path) -> dict[float, tuple]:
    """Each trial by its lr: its state, value, reports to Optuna and its seed's record."""
    found = {}
    for t in study_in(cwd).trials:
        (seed,) = replicates(t)
        found[t.params["lr"]] = (t.state.name, t.value, t.intermediate_values, seed)
    return found


def test_a_packed_sweep_records_each_trial_as_the_unpacked_sweep_does(tmp_path):
    solo, packed = tmp_path / "solo", tmp_path / "packed"
    for cwd, pack in ((solo, 1), (packed, "auto")):
        cwd.mkdir()
        done = run_sweep(cwd, *MIXED, f"hydra.sweeper.pack={pack}")
        assert done.returncode == 0, done.stderr[-3000:]
    # auto: 2 x 2 rollouts a step on a CPU packs, up to the sweep's 3 jobs
    # (sweeper/plan/pack_size.py; tests/test_pack_size.py holds its arithmetic)
    said = "pack=auto: 3 (CPU, 4 rollouts a step: packed up to 256 rollouts, at most 8 and 3 jobs)"
    assert said in done.stdout + done.stderr
    ran, expected = outcomes(packed), outcomes(solo)
    assert {lr: o[0] for lr, o in ran.items()} == {1e-3: "COMPLETE", 3e-2: "PRUNED", 1e30: "FAIL"}
    for lr, (state, value, reports, seed) in ran.items():
        e_state, e_value, e_reports, e_seed = expected[lr]
        assert (state, seed.state, seed.steps_run) == (e_state, e_seed.state, e_seed.steps_run)
        assert seed.reason == e_seed.reason and seed.breach == e_seed.breach
        assert value == pytest.approx(e_value, **FLOAT32) if value is not None else e_value is None
        assert reports.keys() == e_reports.keys()
        assert list(reports.values()) == pytest.approx(list(e_reports.values()), **FLOAT32)
    assert "big_lr" in ran[3e-2][3].reason and "NonFiniteError" in ran[1e30][3].reason
    assert len({o[3].run_id for o in ran.values()}) == 3  # one MLflow run per trial
    runs, e_runs = curves(packed), curves(solo)
    for lr, (status, history) in runs.items():
        e_status, e_history = e_runs[lr]
        assert status == e_status and history.keys() == e_history.keys()
        for key, points in history.items():
            assert [s for s, _ in points] == [s for s, _ in e_history[key]], key
            values, e_values = [v for _, v in points], [v for _, v in e_history[key]]
            assert values == pytest.approx(e_values, nan_ok=True, **FLOAT32), (lr, key)
    for trial in study_in(packed).trials:  # each member logs to its own job's file
        (log,) = (packed / "multirun").glob(f"*/*/t{trial.number}/*.log")
        text = log.read_text()
        assert "packing t0, t1, t2 on one base model" in text
        assert text.count("Training 3 steps") == 1 and f"lr={trial.params['lr']:g}," in text


# Signalled once both members saved step 2: 6 steps to go, so the signal lands mid-training.
RESUMED = ["lr=1e-3,2e-3", *SHAPE[1:], "max_steps=8", "save_every=2", "hydra.sweeper.pack=2"]
RESUMED += ["hydra.sweeper.health=[]"]  # about the signal: no trial may stop on its own


def test_sigterm_stops_every_member_and_the_same_command_resumes_each(tmp_path):
    sweep = start_sweep(tmp_path, *RESUMED, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while len(list(tmp_path.glob("multirun/*/*/t*/checkpoints/step_000002/state.json"))) < 2:
        assert sweep.poll() is None, sweep.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the pack saved no step-2 checkpoints"
        time.sleep(0.1)
    sweep.send_signal(signal.SIGTERM)
    _, stderr = sweep.communicate(timeout=60)
    assert "interrupted (SIGTERM)" in stderr and "resume with the same command" in stderr
    stopped = [t for t in study_in(tmp_path).trials if t.state.name == "FAIL"]
    assert len(stopped) == 2  # both members; their points are queued again
    for trial in stopped:  # each member recorded its own interruption
        (seed,) = replicates(trial)
        assert (seed.state, seed.reason) == (State.FAIL, "interrupted"), trial.number
    done = run_sweep(tmp_path, *RESUMED)
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(mlflow_uri(tmp_path))
    retries = [t for t in study_in(tmp_path).trials if TrialAttr.RETRY_OF in t.user_attrs]
    assert sorted(t.params["lr"] for t in retries) == [1e-3, 2e-3]
    for retry in retries:
        (seed,) = replicates(retry)
        assert seed.state == State.COMPLETE and seed.steps_run == 8
        assert seed.resumed_from_step is not None and seed.resumed_from_step >= 2
        steps = {m.step for m in client.get_metric_history(seed.run_id, "reward/mean")}
        assert steps == set(range(1, 9))  # the interrupted run, continued


def test_racing_packs_its_seeds_and_each_seed_is_a_run_of_its_own(tmp_path):
    """seeds=auto with pack=2: the race's seeds run as packed jobs (a job queued meanwhile
    joins the running pack), and each is recorded as an unpacked race records it."""
    done = run_sweep(
        tmp_path, "lr=1e-3,2e-3", *SHAPE, "hydra.sweeper.pack=2", "hydra.sweeper.seeds=auto"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    trials = study_in(tmp_path).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    seeds = [s for t in trials for s in replicates(t)]
    assert all(len(replicates(t)) >= 2 for t in trials)  # MIN_SEEDS each, raced
    assert all(s.state == State.COMPLETE and s.steps_run == 3 for s in seeds)
    assert len({s.run_id for s in seeds}) == len(seeds)  # one MLflow run per seed
    logs = [p.read_text() for p in (tmp_path / "multirun").glob("*/*/t*-s*/*.log")]
    packed = [text for text in logs if "packing" in text or "joins the pack" in text]
    assert len(packed) >= 2 * len(trials)  # the first MIN_SEEDS of each, at least, in packs


# pack=2: t0 is pruned after step 2 while t1 trains on to step 6, and t2, queued, takes t0's slot.
REFILLED = ["lr=3e-2,1e-3,2e-3", f"hydra.sweeper.health=[{BIG_LR}]", *SHAPE[1:]]


def test_a_queued_job_takes_the_slot_of_a_pruned_member_while_the_pack_runs(tmp_path):
    done = run_sweep(tmp_path, *REFILLED, "max_steps=6", "hydra.sweeper.pack=2")
    assert done.returncode == 0, done.stderr[-3000:]
    trials = {t.number: t for t in study_in(tmp_path).trials}
    states = {n: t.state.name for n, t in trials.items()}
    assert states == {0: "PRUNED", 1: "COMPLETE", 2: "COMPLETE"}
    client = MlflowClient(mlflow_uri(tmp_path))
    seeds = {n: replicates(t)[0] for n, t in trials.items()}  # each trial's record
    for n, seed in seeds.items():
        assert seed.run_id == trials[n].user_attrs[TrialAttr.MLFLOW_RUN_ID], n
    assert seeds[0].steps_run < 6 and "big_lr" in seeds[0].reason
    assert seeds[1].steps_run == seeds[2].steps_run == 6
    runs = {n: client.get_run(seed.run_id).info for n, seed in seeds.items()}  # one each
    assert [runs[n].status for n in range(3)] == ["KILLED", "FINISHED", "FINISHED"]
    # t2 started once t0 had ended and before t1, which it joined, ended
    assert runs[0].end_time <= runs[2].start_time < runs[1].end_time
    logs = {n: next((tmp_path / "multirun").glob(f"*/*/t{n}/*.log")).read_text() for n in trials}
    assert all("packing t0, t1 on one base model" in logs[n] for n in (0, 1))
    assert "t2 joins the pack at round" in logs[2] and "t2 joins the pack" in logs[1]
    steps = {m.step for m in client.get_metric_history(runs[2].run_id, "reward/mean")}
    assert steps == set(range(1, 7))  # it trained every step, in the pack and after t1 ended


def test_a_signal_stops_a_member_that_joined_and_the_same_command_resumes_it(tmp_path):
    """SIGTERM once t2, which took pruned t0's slot, saved step 2: t1 and t2 record themselves
    interrupted, and the same command resumes each from its own checkpoint."""
    args = [*REFILLED, "max_steps=8", "save_every=2", "hydra.sweeper.pack=2"]
    sweep = start_sweep(tmp_path, *args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not list(tmp_path.glob("multirun/*/*/t2/checkpoints/step_000002/state.json")):
        assert sweep.poll() is None, sweep.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "t2 saved no step-2 checkpoint"
        time.sleep(0.1)
    sweep.send_signal(signal.SIGTERM)
    _, stderr = sweep.communicate(timeout=60)
    assert "interrupted (SIGTERM)" in stderr
    trials = study_in(tmp_path).trials[:3]  # then the points of t1 and t2, queued again
    assert [t.state.name for t in trials] == ["PRUNED", "FAIL", "FAIL"]
    (log,) = tmp_path.glob("multirun/*/*/t2/*.log")
    assert "t2 joins the pack at round" in log.read_text()
    for trial in trials[1:]:
        (seed,) = replicates(trial)
        assert (seed.state, seed.reason) == (State.FAIL, "interrupted"), trial.number
    done = run_sweep(tmp_path, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    retries = [t for t in study_in(tmp_path).trials if TrialAttr.RETRY_OF in t.user_attrs]
    assert sorted(t.user_attrs[TrialAttr.RETRY_OF] for t in retries) == [1, 2]
    for retry in retries:
        (seed,) = replicates(retry)
        assert seed.state == State.COMPLETE and seed.steps_run == 8
        assert seed.resumed_from_step is not None and seed.resumed_from_step >= 2


def test_a_queued_job_that_cannot_share_the_model_runs_after_the_pack(tmp_path):
    """t2 (another LoRA rank) would take pruned t0's slot: it runs once the pack has ended."""
    grid = ["lora_rank=8,16", "lr=3e-2,1e-3", *REFILLED[1:], "max_steps=6"]  # t2, t3: rank 16
    done = run_sweep(tmp_path, *grid, "hydra.sweeper.pack=2")
    assert done.returncode == 0, done.stderr[-3000:]
    trials = study_in(tmp_path).trials
    assert [t.state.name for t in trials] == ["PRUNED", "COMPLETE", "PRUNED", "COMPLETE"]
    client = MlflowClient(mlflow_uri(tmp_path))
    runs = [client.get_run(replicates(t)[0].run_id).info for t in trials]  # one each
    assert runs[1].end_time <= runs[2].start_time  # after the pack
    (log,) = (tmp_path / "multirun").glob("*/*/t1/*.log")
    assert "t2 runs after the pack: lora_rank" in log.read_text()


def test_queued_jobs_that_cannot_join_or_cannot_start_fail_alone(tmp_path):
    """Two queued jobs lose a file once the pack of t0 and t1 has started: t2's config file
    (+tuned=gone: it no longer composes, so it cannot join) and t3's task file (+tuned=nodata:
    it joins, and its setup raises before its first step). Each fails with its error, alone;
    t1 trains on. Pruned t0's slot is offered to t2, then to t3."""
    rows = "".join(
        json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) + "\n" for a in range(40)
    )
    tuned = tmp_path / "tuned"  # the working directory's configs (hydra_plugins/grpo_sweeper)
    tuned.mkdir()
    for name, lr in {"big": "3e-2", "small": "1e-3", "gone": "2e-3", "nodata": "2e-3"}.items():
        (tmp_path / f"{name}.jsonl").write_text(rows)
        task = f"task:\n  path: {tmp_path / name}.jsonl\n"
        (tuned / f"{name}.yaml").write_text(f"# @package _global_\nlr: {lr}\n{task}")
    shape = [a for a in REFILLED[1:] if not a.startswith("task.eval_size")]  # a file's share
    # A job that never started is lost, as a solo job whose config does not compose: queued
    # again up to max_lost_in_a_row times (sweeper/study/recovery.py). 1: it fails at once.
    args = ["+tuned=big,small,gone,nodata", *shape, "task=jsonl", "max_steps=6"]
    args += ["hydra.sweeper.pack=2", "hydra.sweeper.max_lost_in_a_row=1"]
    sweep = start_sweep(tmp_path, *args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while "packing t0, t1" not in "".join(
        p.read_text() for p in tmp_path.glob("multirun/*/*/t0/*.log")
    ):
        assert sweep.poll() is None, sweep.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the pack did not start"
        time.sleep(0.05)
    (tuned / "gone.yaml").unlink()
    (tmp_path / "nodata.jsonl").unlink()
    gone_at = time.time()
    _, stderr = sweep.communicate(timeout=300)
    assert sweep.returncode == 0, stderr[-3000:]
    trials = {t.number: t for t in study_in(tmp_path).trials}
    states = {n: t.state.name for n, t in trials.items()}
    assert states == {0: "PRUNED", 1: "COMPLETE", 2: "FAIL", 3: "FAIL"}
    client = MlflowClient(mlflow_uri(tmp_path))
    pruned, completed = (client.get_run(replicates(trials[n])[0].run_id).info for n in (0, 1))
    assert gone_at * 1000 < pruned.end_time  # the files went while t0 still trained
    assert completed.status == "FINISHED" and replicates(trials[1])[0].steps_run == 6
    reason = trials[2].user_attrs[TrialAttr.FAIL_REASON]
    assert "its job died" in reason and "tuned/gone" in reason, reason
    assert replicates(trials[2]) == []  # it never started: no record, no MLflow run of its own
    (log,) = (tmp_path / "multirun").glob("*/*/t1/*.log")
    assert "trial 2's job cannot join the pack" in log.read_text()
    reason = trials[3].user_attrs[TrialAttr.FAIL_REASON]
    assert "nodata.jsonl" in reason, reason
    (seed,) = replicates(trials[3])  # it started: its own record, before its first step
    assert seed.state == State.FAIL and not seed.steps_run, seed
    (log,) = (tmp_path / "multirun").glob("*/*/t3/*.log")
    assert "t3 joins the pack at round" in log.read_text()
