"""Our training run from config to result: the training loop (train: `trainer.run.train.train`,
the `ours` backend), the health rules every run's metrics are checked by after each step (a
single run warns, a sweep's job prunes; health), the config checks every backend shares
(validation), the learning-rate schedule (lr) and checkpoints (checkpoint). MLflow tracking
and the stores are records/'s. May import every layer below: base, model, env, sampling and
rl.
"""
