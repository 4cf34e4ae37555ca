"""The PostgreSQL path: an Optuna RDB storage and an MLflow backend on a real server."""

import subprocess
import sys
import threading

import optuna
import pytest
from mlflow.tracking import MlflowClient
from pg_server import postgres  # noqa: F401  (fixture)

from records.optuna_storage import exclusive

HOLD_THE_PLAN = """
import sys
from records.optuna_storage import exclusive
with exclusive(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()
"""


@pytest.mark.postgres
def test_optuna_and_mlflow_share_one_postgres_server(postgres):  # noqa: F811
    optuna_url, mlflow_url = postgres.database("optuna"), postgres.database("mlflow")
    study = optuna.create_study(storage=optuna_url, study_name="smoke", direction="maximize")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    reloaded = optuna.load_study(storage=optuna_url, study_name="smoke")
    assert len(reloaded.trials) == 3
    client = MlflowClient(mlflow_url)
    experiment = client.create_experiment("smoke")
    run = client.create_run(experiment)
    client.log_metric(run.info.run_id, "reward/mean", 0.5, step=1)
    assert client.get_metric_history(run.info.run_id, "reward/mean")[0].value == 0.5


@pytest.mark.postgres
@pytest.mark.parametrize("end", ["released", "killed"])
def test_the_plan_lock_holds_off_other_processes_until_released_or_killed(postgres, end):  # noqa: F811
    url = postgres.database("plan_lock")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_THE_PLAN, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline() == "held\n"
    acquired = threading.Event()

    def take_it() -> None:
        with exclusive(url):
            acquired.set()

    threading.Thread(target=take_it, daemon=True).start()
    assert not acquired.wait(1.0)  # another process holds it: this one waits
    if end == "released":
        holder.stdin.write("\n")
        holder.stdin.flush()
    else:
        holder.kill()  # kill -9: the server ends the session, and the lock with it
    assert acquired.wait(30)
    holder.wait(timeout=30)
