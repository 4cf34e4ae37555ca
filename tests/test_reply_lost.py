"""A write whose commit reached the database but whose reply was lost (a connection dropped
right after COMMIT) is retried; the retry must not store it twice. Real SQLite stores, real
Optuna and MLflow: a SQLAlchemy event raises a connection error once, after a commit went
through."""

from __future__ import annotations

import contextlib
import sqlite3

import optuna
import pytest
import sqlalchemy.event
import sqlalchemy.exc
from optuna.distributions import CategoricalDistribution
from sqlalchemy.orm import ORMExecuteState, Session

from records.optuna_storage import open_storage
from records.tracking import MLflowRun, experiment_id
from records.tracking_store import tracking_client
from sweeper.study import slots


@contextlib.contextmanager
def reply_lost_once():
    """The next commit that writes goes through, then its caller sees the connection drop."""
    lost = []

    def wrote(session: Session, context: object) -> None:
        session.info["wrote"] = True

    def executed(state: ORMExecuteState) -> None:
        if state.is_insert or state.is_update or state.is_delete:
            state.session.info["wrote"] = True

    def drop(session: Session) -> None:
        if session.info.pop("wrote", False) and not lost:
            lost.append(True)
            raise sqlalchemy.exc.OperationalError("COMMIT", {}, sqlite3.OperationalError("lost"))

    sqlalchemy.event.listen(Session, "after_flush", wrote)
    sqlalchemy.event.listen(Session, "do_orm_execute", executed)
    sqlalchemy.event.listen(Session, "after_commit", drop)
    try:
        yield
    finally:
        sqlalchemy.event.remove(Session, "after_commit", drop)
        sqlalchemy.event.remove(Session, "after_flush", wrote)
        sqlalchemy.event.remove(Session, "do_orm_execute", executed)
    assert lost, "no commit happened in the block"


@pytest.fixture
def study(tmp_path) -> tuple[optuna.Study, str]:
    url = f"sqlite:///{tmp_path}/study.db"
    return optuna.create_study(storage=open_storage(url), study_name="s"), url


def test_a_queued_slot_claimed_and_told_once_each(study):
    study, url = study
    with reply_lost_once():
        study.enqueue_trial({"x": 1})
    assert [t.state.name for t in study.get_trials()] == ["WAITING"]  # not queued twice
    with reply_lost_once():
        trial = slots.take(study, url, {"x": CategoricalDistribution([1, 2])})
    assert trial is not None and trial.params == {"x": 1}  # the claim that went through is ours
    with reply_lost_once():
        trial.set_user_attr("k", 1)
    with reply_lost_once():
        trial.report(0.5, 3)
    with reply_lost_once():
        study.tell(trial, 1.0)  # the retry sees it told, instead of "already finished"
    (told,) = study.get_trials()
    assert (told.state.name, told.value, told.user_attrs) == ("COMPLETE", 1.0, {"k": 1})
    assert told.intermediate_values == {3: 0.5}


def test_a_run_created_and_a_metric_step_logged_once(tmp_path):
    client = tracking_client(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = experiment_id(client, "e")
    with reply_lost_once():
        created = client.create_run(experiment, run_name="r")
    assert [r.info.run_id for r in client.search_runs([experiment])] == [created.info.run_id]
    run = MLflowRun.attach(created.info.run_id, client)
    for step in (1, 2):
        with reply_lost_once():
            run.log_metrics(step, {"m": float(step)})
    history = client.get_metric_history(run.run_id, "m")
    assert sorted((m.step, m.value) for m in history) == [(1, 1.0), (2, 2.0)]
