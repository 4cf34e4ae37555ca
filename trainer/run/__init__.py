"""One training run from config to result: the training loop and library API
(train: `trainer.run.train.train`), the run logged to MLflow that `python -m trainer` and each
sweep job call (logged_run), the config checks (validation), the learning-rate schedule (lr),
checkpoints (checkpoint), MLflow tracking and its database (tracking, database, locks) and
the sweep job's schema (sweep_job). May import every layer below: base, model, env, sampling
and rl.
"""
