"""The plan as queued trials, on a real SQLite storage shared by several "workers"."""

from __future__ import annotations

import threading
import time
from collections import Counter

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from records.optuna_storage import exclusive, open_storage
from records.sweep import Replicate, State, TrialAttr, is_interrupted, replicate_key
from sweeper import optuna_adapter as oa
from sweeper.plan.search_sampler import choose_search_sampler
from sweeper.plan.space import parse_space
from sweeper.results import display
from sweeper.study import recovery, slots
from sweeper.study.heartbeat import Heartbeat
from sweeper.study.recovery import fail_stale_trials


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path}/sweeps.db"


def _study(url, search_sampler, name="s"):
    return optuna.create_study(
        storage=open_storage(url),
        study_name=name,
        sampler=search_sampler.optuna_sampler,
        load_if_exists=True,
    )


def test_workers_taking_at_once_cover_a_grid_exactly_once(url):
    space = parse_space({}, ["group_size=2,4,8", "lr=1e-3,2e-3", "loss=ppo,dapo"])
    search_sampler = choose_search_sampler("auto", space, 100, None)
    assert slots.fill(_study(url, search_sampler), url, space, search_sampler) == 12
    # a resume queues nothing more
    assert slots.fill(_study(url, search_sampler), url, space, search_sampler) == 0
    taken: list[dict] = []

    def worker() -> None:
        study = _study(url, search_sampler)  # its own storage connection, like another process
        while (trial := slots.take(study, url, space.distributions)) is not None:
            taken.append(trial.params)
            study.tell(trial, 1.0)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(taken) == 12
    assert set(Counter(tuple(sorted(p.items())) for p in taken).values()) == {1}
    assert len(_study(url, search_sampler).trials) == 12


def test_a_worker_joining_while_a_slot_is_half_taken_queues_nothing(url):
    # Taking a slot writes its params one by one; a worker that joins in between (and
    # fills the plan) must still see the whole point as present.
    space = parse_space({}, ["group_size=2,4", "lr=1e-3,2e-3"])
    search_sampler = choose_search_sampler("auto", space, 100, None)
    study = _study(url, search_sampler)
    assert slots.fill(study, url, space, search_sampler) == 4
    study.ask().suggest_categorical("group_size", [2, 4])  # the first of two params written
    assert [t.params for t in study.trials if t.state == TrialState.RUNNING] == [{"group_size": 2}]
    assert slots.fill(_study(url, search_sampler), url, space, search_sampler) == 0
    assert len(study.trials) == 4


def test_a_tpe_plan_runs_n_trials_in_total_and_grows_with_n_trials(url):
    space = parse_space({}, ["lr=tag(log, interval(1e-4, 1e-2))"])
    search_sampler = choose_search_sampler("auto", space, 3, seed=0)
    study = _study(url, search_sampler)
    assert slots.fill(study, url, space, search_sampler) == 3
    while (trial := slots.take(study, url, space.distributions)) is not None:
        assert 1e-4 <= trial.params["lr"] <= 1e-2
        study.tell(trial, trial.params["lr"])
    assert display.Counts.of(study).complete == 3
    more = choose_search_sampler("auto", space, 5, seed=0)
    assert slots.fill(study, url, space, more) == 2


def _beating_grid(url, grace_period):
    """A two-point grid queued in a study with heartbeats every second."""
    space = parse_space({}, ["group_size=2,4"])
    search_sampler = choose_search_sampler("auto", space, 10, None)
    study = optuna.create_study(
        storage=open_storage(url, heartbeat_interval=1, grace_period=grace_period),
        study_name="s",
        sampler=search_sampler.optuna_sampler,
    )
    slots.fill(study, url, space, search_sampler)
    return study, space, search_sampler


def _study_with_a_stale_trial(url):
    """A two-point grid whose first taken trial's sweeper died (its heartbeat is stale)."""
    study, space, search_sampler = _beating_grid(url, grace_period=1)
    trial = slots.take(study, url, space.distributions)
    oa.record_heartbeat(study, trial._trial_id)  # ...then its sweeper dies
    time.sleep(2.5)
    return study, space, search_sampler


def test_a_live_sweepers_heartbeat_keeps_its_long_trial_from_going_stale(url):
    """A trial running for several grace periods stays its worker's while the worker's
    heartbeat thread runs (it once failed on every beat, silently, so any trial longer than
    the grace period was taken over by another worker), and goes stale once the beats stop."""
    study, space, _ = _beating_grid(url, grace_period=2)
    trial_id = slots.take(study, url, space.distributions)._trial_id
    with Heartbeat(study, lambda: [trial_id]) as heartbeat:
        heartbeat.beat([trial_id])
        for _ in range(3):  # 6 s: three grace periods
            time.sleep(2)
            assert oa.stale_trial_ids(study) == []
    time.sleep(3)
    assert oa.stale_trial_ids(study) == [trial_id]


def test_workers_joining_at_once_with_a_larger_n_trials_add_the_difference_once(url):
    space = parse_space({}, ["lr=tag(log, interval(1e-4, 1e-2))"])
    search_sampler = choose_search_sampler("auto", space, 3, seed=0)
    assert slots.fill(_study(url, search_sampler), url, space, search_sampler) == 3
    more = choose_search_sampler("auto", space, 6, seed=0)
    at_once = threading.Barrier(4)
    added: list[int] = []

    def joiner() -> None:
        study = _study(url, more)
        at_once.wait()
        added.append(slots.fill(study, url, space, more))

    threads = [threading.Thread(target=joiner) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(added) == [0, 0, 0, 3]
    assert display.Counts.of(_study(url, more)).waiting == 6


def test_a_worker_killed_between_taking_a_slot_and_its_first_beat_leaves_a_stale_trial(url):
    """Found by bench/bench_chaos.py: a SIGKILL right after the claim left trials RUNNING with
    no heartbeat, which Optuna never calls stale, and every worker waited for them forever."""
    study, space, _ = _beating_grid(url, grace_period=1)
    trial = slots.take(study, url, space.distributions)  # ...and its worker dies at once
    time.sleep(2.5)
    assert oa.stale_trial_ids(study) == [trial._trial_id]


def test_a_stale_trial_is_failed_once_and_its_point_queued_again(url):
    study, space, _ = _study_with_a_stale_trial(url)
    (stale,) = fail_stale_trials(study, "its sweeper died", max_in_a_row=3)
    assert fail_stale_trials(study, "its sweeper died", max_in_a_row=3) == []  # one worker wins
    assert stale.state == TrialState.FAIL and stale.user_attrs["interrupted"]
    assert stale.user_attrs["fail_reason"] == "lost: its sweeper died; queued again"
    slots.give_back(study, stale, {"0": {"output_dir": "/x/t0", "run_id": "r0"}})
    counts = display.Counts.of(study)
    assert (counts.failed, counts.waiting) == (0, 2)  # the interrupted trial counts for nothing
    rest = [slots.take(study, url, space.distributions) for _ in range(2)]
    assert sorted(t.params["group_size"] for t in rest) == [2, 4]
    (retry,) = [t for t in rest if "retry_of" in t.user_attrs]
    assert retry.user_attrs["retry_of"] == stale.number and retry.params == stale.params
    assert retry.user_attrs["resume_dirs"] == {"0": {"output_dir": "/x/t0", "run_id": "r0"}}


def test_a_worker_filling_while_another_gives_a_point_back_queues_nothing(url):
    # Between failing an interrupted trial and queuing its point again the point looks
    # missing; a worker joining then (and filling the plan) would queue it a second time.
    study, space, search_sampler = _study_with_a_stale_trial(url)
    failed, queued_by_joiner = threading.Event(), []

    def joiner() -> None:
        failed.wait()
        queued_by_joiner.append(slots.fill(_study(url, search_sampler), url, space, search_sampler))

    thread = threading.Thread(target=joiner)
    thread.start()
    with exclusive(url):  # as the sweep recovers a stale trial
        (stale,) = fail_stale_trials(study, "its sweeper died", max_in_a_row=3)
        failed.set()
        time.sleep(0.5)  # the joiner is at the lock by now
        slots.give_back(study, stale, {})
    thread.join()
    assert queued_by_joiner == [0]
    assert display.Counts.of(study).waiting == 2


def test_a_worker_killed_while_taking_a_slot_gives_back_the_whole_point(url):
    """Found by bench/bench_chaos.py: a worker killed between writing a slot's first param and
    its last gave back only the params written; the retry drew the rest at random and resumed
    another point's run from its checkpoint (MLflow refused: "Changing param values")."""
    space = parse_space({}, ["group_size=2,4", "lr=1e-3,2e-3", "batch_size=2,4"])
    search_sampler = choose_search_sampler("auto", space, 100, None)
    study = _study(url, search_sampler)
    slots.fill(study, url, space, search_sampler)
    slot = oa.waiting_trials(study)[0]
    point = slot.system_attrs["fixed_params"]
    assert oa.claim(study, slot)
    optuna.Trial(study, slot._trial_id).suggest_categorical("group_size", [2, 4])  # ...killed
    lost = oa.fresh(study, slot._trial_id)
    assert lost.params == {"group_size": point["group_size"]}  # half-written
    assert recovery.interrupt(study, slot._trial_id, "lost")
    slots.give_back(study, oa.fresh(study, slot._trial_id), {"0": {"output_dir": "/x/t0"}})
    (retry,) = [t for t in oa.waiting_trials(study) if TrialAttr.RETRY_OF in t.user_attrs]
    assert retry.system_attrs["fixed_params"] == point
    taken = [slots.take(study, url, space.distributions) for _ in range(8)]
    (resumed,) = [t for t in taken if TrialAttr.RETRY_OF in t.user_attrs]
    assert resumed.params == point


def test_a_point_whose_give_back_was_cut_short_is_left_to_the_sweep_not_queued_afresh(url):
    """A worker killed between failing a stale trial and queuing its point: a worker joining
    later must not queue the point afresh (its checkpoint would be lost); the point is found
    as never queued again, until its retry is queued."""
    study, space, search_sampler = _study_with_a_stale_trial(url)
    (stale,) = fail_stale_trials(study, "its sweeper died", max_in_a_row=3)  # ...killed here
    assert [t.number for t in slots.never_queued_again(study.trials)] == [stale.number]
    assert slots.fill(_study(url, search_sampler), url, space, search_sampler) == 0
    slots.give_back(study, stale, {})
    assert slots.never_queued_again(study.trials) == []
    assert display.Counts.of(study).waiting == 2


def test_a_point_left_unqueued_is_queued_again_once_a_grace_has_passed(url, tmp_path, monkeypatch):
    """Found by bench/bench_chaos.py: a server restart drops the plan's lock (a session lock)
    while a worker is between failing a lost trial and queuing its point; another worker took
    the lock, saw the point never queued again and queued it too (the point ran twice). A
    point is queued again only after a whole grace unqueued, then once."""
    from types import SimpleNamespace

    from sweeper.sweep.tell import give_back_lost

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    study, _, _ = _study_with_a_stale_trial(url)
    (stale,) = fail_stale_trials(study, "its sweeper died", max_in_a_row=3)  # ...still going
    settings = SimpleNamespace(
        fail_stale_trials=True, grace_period=1, heartbeat_interval=1, storage=url
    )
    give_back_lost(study, settings, "s")  # another worker, at once: it waits
    assert [t.user_attrs.get(TrialAttr.RETRY_OF) for t in study.trials] == [None, None]
    time.sleep(1.1)  # nobody queued it meanwhile: its worker was killed
    give_back_lost(study, settings, "s")
    give_back_lost(study, settings, "s")
    retries = [t for t in study.trials if t.user_attrs.get(TrialAttr.RETRY_OF) == stale.number]
    assert len(retries) == 1 and retries[0].state == TrialState.WAITING


def test_a_point_lost_again_and_again_fails_only_when_it_gets_no_further(url, tmp_path):
    """max_lost_in_a_row counts losses with no new checkpoint between them: a run that kills
    its worker at the same step loops, one preempted while it progresses does not."""
    space = parse_space({}, ["group_size=2"])
    search_sampler = choose_search_sampler("auto", space, 10, None)
    study = _study(url, search_sampler)
    slots.fill(study, url, space, search_sampler)
    output_dir = tmp_path / "t0"

    def take_and_lose(new_checkpoint_step: int | None) -> FrozenTrial:
        trial = slots.take(study, url, space.distributions)
        record = Replicate(
            0, State.RUNNING, None, None, 0, None, "", None, output_dir=str(output_dir)
        )
        trial.set_user_attr(replicate_key(0), record.as_attr())
        if new_checkpoint_step is not None:
            (output_dir / "checkpoints" / f"step_{new_checkpoint_step:06d}").mkdir(parents=True)
        assert recovery.lose(study, trial._trial_id, "killed (this test)", max_in_a_row=3)
        lost = oa.fresh(study, trial._trial_id)
        if is_interrupted(lost):
            slots.give_back(study, lost, {})
        return lost

    progressing = [take_and_lose(step) for step in (3, 6, 9, 12)]
    assert [t.user_attrs[TrialAttr.LOST_IN_A_ROW] for t in progressing] == [1, 1, 1, 1]
    assert all(is_interrupted(t) for t in progressing)
    # the last progressing loss opens the row: two more with nothing saved make three
    stuck = [take_and_lose(None) for _ in range(2)]
    assert [t.user_attrs[TrialAttr.LOST_IN_A_ROW] for t in stuck] == [2, 3]
    assert is_interrupted(stuck[0]) and not is_interrupted(stuck[-1])
    assert stuck[-1].user_attrs[TrialAttr.FAIL_REASON].startswith("lost 3 times in a row")
