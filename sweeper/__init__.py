"""The GRPO sweeper: `python -m sweeper -m group_size=4,8 lr=1e-5,2e-5`.

Modules, one job each, in the order a sweep uses them:
  settings       the sweeper's settings, resolved and checked once
  space          the search space from Hydra overrides (choices, ranges, intervals)
  samplers       the Optuna sampler and how many trials the sweep plans
  breaches       searching samplers kept off regions where health rules fired
  plan           what a sweep will run, decided and checked before anything heavy loads
  preflight      every reachable configuration composed and validated before the first trial
  storage        the study's storage URL, opened safely, the plan's lock, heartbeats
  study          create or join the study and its MLflow parent run
  slots          the plan as queued trials that workers take one at a time
  sweep          the take -> launch -> tell loop Hydra's Sweeper hands over to
  job            each trial's task function: one training run reported to MLflow and Optuna
  pruning        stopping a trial early: a health rule fired, or the objective pruner said so
  replicates     a configuration's seeds -> its outcome, what the study is told
  racing         seeds=auto: more seeds only where they can change the verdict
  terminator     terminator=true: stop a search when nothing more is to gain
  recovery       trials lost to the infrastructure, told apart from trials that failed
  stopping       process signals (SIGTERM, SIGHUP): stop the runs, queue their points again
  runs           the sweep's MLflow runs and how each one ends
  devices        one trial per GPU from a device pool
  display        the progress line after each trial and the final table
  optuna_adapter every use of Optuna's and Hydra's non-public API, in one place
  errors         the one error a user sees: one line, exit code 1
The records a sweep writes (keys, tags, states) are analysis/records.py's, the results layer
below this package; the training it runs is trainer/'s.
"""


class SweepError(Exception):
    """The one error a user sees from the sweeper: a setting or search space that cannot
    work. One line naming what and why; the command exits with code 1."""
