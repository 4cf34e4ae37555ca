"""The GRPO sweeper: `python -m sweeper -m group_size=4,8 lr=1e-5,2e-5`.

Modules, one job each:
  space      search space from Hydra overrides (choices, ranges, intervals, presets)
  samplers   Optuna sampler and objective pruner from the settings
  pruning    the KL prune rule (our own: Optuna's report takes one value per step)
  storage    storage URL checks, heartbeats, stale trials
  study      create or join the study and its MLflow parent run
  slots      the plan as queued trials that workers take one at a time
  preflight  compose and validate every grid point / range endpoint before any trial
  sweep      the take -> launch -> tell loop Hydra's Sweeper hands over to
  job        the task function of each trial: train with an MLflow + Optuna reporter
  records    MLflow parent run and trial bookkeeping shared by sweep and job
  tuned      tuned/<study>.yaml from the best trial
  display    progress line and final table
"""
