"""The PostgreSQL path: an Optuna RDB storage and an MLflow backend on a real server."""

import optuna
import pytest
from mlflow.tracking import MlflowClient
from pg_server import postgres  # noqa: F401  (fixture)


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
