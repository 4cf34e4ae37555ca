"""Read a finished, running or killed sweep from its stores and say what happened.

Modules, one job each:
  load      Optuna storage + MLflow -> per-trial records and per-step histories
  stores    the stores opened to outlast a restart (every call retried), for sweep and reads
  plots     the figures (matplotlib, Agg)
  advice    rules of thumb -> "what to try next"
  report    terminal leaderboard and the self-contained HTML report
  tuned     the best trial's tuned YAML (the sweeper's renderer)
  compare   two studies side by side
"""
