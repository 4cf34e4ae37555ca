"""Our training run from config to result: the training loop (train: `trainer.run.train.train`,
the `ours` backend), the config checks every backend shares (validation), the learning-rate
schedule (lr), checkpoints (checkpoint), MLflow tracking and its database (tracking, database,
locks). May import every layer below: base, model, env, sampling and rl.
"""
