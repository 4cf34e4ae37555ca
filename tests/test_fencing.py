"""The plan lease's fencing token: a holder whose lease another process took over (its session
was seen ended: a partition, a restart) cannot write under it; the new holder can, and writes
outside any lease (heartbeats) are not fenced."""

from __future__ import annotations

import threading

import optuna
import psycopg
import pytest
from pg_server import postgres  # noqa: F401  (fixture)

from records.leases import LEASE_TABLE, LeaseLost, lease
from records.optuna_storage import exclusive, open_storage, store_name

pytestmark = pytest.mark.postgres


def lease_row(url: str) -> tuple[str, int, int]:
    with psycopg.connect(url, autocommit=True) as c:
        q = f"SELECT owner, pid, token FROM {LEASE_TABLE} WHERE name = 'plan'"
        return c.execute(q).fetchone()


def cut_off(url: str, pid: int) -> None:
    """The holder's lease session ends, as the server ends one whose host stopped answering
    its keepalives; the holder itself goes on."""
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT pg_terminate_backend(%s)", (pid,))


def test_a_holder_whose_plan_lease_was_taken_over_cannot_write(postgres):  # noqa: F811
    url = postgres.database("fencing")
    storage = open_storage(url)
    study = optuna.create_study(storage=storage, study_name="fenced")
    taken, done = threading.Event(), threading.Event()
    new_holder: dict = {}

    def take_over() -> None:  # another worker: a thread starts without this thread's leases
        with lease(url, "plan", store_name(url)) as token:
            new_holder["token"] = token
            taken.set()
            study.enqueue_trial({"x": 2})  # the new holder writes under its own lease
            done.wait(60)

    with exclusive(url):
        study.enqueue_trial({"x": 1})  # still the holder: written
        owner, pid, token = lease_row(url)
        other = threading.Thread(target=take_over)
        other.start()
        while not taken.wait(0.2):  # ends its session until the other has taken it
            if lease_row(url)[0] == owner:  # (its renewal may have come back first)
                cut_off(url, lease_row(url)[1])
        assert new_holder["token"] == token + 1
        with pytest.raises(LeaseLost, match="plan lease .* was taken over"):
            study.enqueue_trial({"x": 3})
        study.get_trials()  # reading is not fenced
    done.set()
    other.join(60)
    params = [t.params.get("x", t.system_attrs["fixed_params"]["x"]) for t in study.trials]
    assert sorted(params) == [1, 2], "the fenced-off write left a row"


def test_writes_outside_a_lease_and_under_a_lease_kept_are_not_fenced(postgres):  # noqa: F811
    url = postgres.database("unfenced")
    storage = open_storage(url)
    study = optuna.create_study(storage=storage, study_name="kept")
    with exclusive(url):
        owner, _, _ = lease_row(url)
        study.enqueue_trial({"x": 1})
        trial = study.ask()
        storage.record_heartbeat(trial._trial_id)
        assert lease_row(url)[0] == owner
    study.tell(trial, 1.0)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE]
