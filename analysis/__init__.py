"""Read a finished, running or killed sweep from its stores and say what happened.

Modules, one job each (the records and stores they read are records/'s):
  load        Optuna storage + MLflow -> per-trial records and per-step histories
  verdict     each configuration's mean and interval; best, tied or too few seeds to tell
  next_step   the verdict's next step: a recorded cause seeds cannot fix, else more seeds
  advice      rules of thumb -> "what to try next"
  plots       the figures (matplotlib, Agg)
  kl_plots    the KL figures, with the study's health rules drawn as it pruned with them
  plot_style  what the figures share: colours, markers, legend entries
  text        text a person reads: swept values, table cells, a trial's one-line note
  report      terminal leaderboard and the self-contained HTML report
  mlflow_ui   the link that opens a study's runs in the MLflow UI, and its saved view
  tuned       the best trial's tuned YAML (`python -m analysis best`, records/tuned_file.py's)
  adapter_model  the best trial's LoRA adapter as an MLflow model naming its base model
  compare     two studies side by side
  sweep_job   the sweep job's config: the training schema plus the binding to its trial
  curve_labels  what became of a run, from its whole curve: learning, collapsed, hacked, ...
  rule_replay   health rules replayed on finished runs: prunes, catches, false prunes, delay
  proportions   a share of runs with its 95% interval: Wilson's, or clustered by seed or replay
  experiment_rules  the rules over an MLflow experiment's runs (TRL's too): the stops, steps saved

`__main__` is `python -m analysis {report,best,compare,rules}`.
"""
