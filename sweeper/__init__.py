"""The GRPO sweeper: `python -m sweeper -m group_size=4,8 lr=1e-5,2e-5`.

Its nouns (study, plan, configuration, trial, slot, seed, job, lane, run, search sampler vs
LLM sampler, pruned vs eliminated vs stopped) are defined once, in docs/glossary.md.

Four stages, each a sub-package, in the order a sweep uses them; each module has one job.
Their imports point one way, down the chain sweep -> study -> plan -> results (a stage imports
its own modules and the stages after it here, never one before; results, what a sweep shows,
is the bottom), checked by tests/test_import_graph.py:

plan/        what a sweep will run, decided and checked before anything heavy loads
  settings_schema  the sweeper's settings as typed (hydra.sweeper.*), which Hydra's plugin
                   registers
  settings        the sweeper's settings, resolved and checked once
  pack_size       pack=auto: how many jobs a pack takes, from the batch and the device
  space           the search space from Hydra overrides (choices, ranges, intervals)
  search_sampler  the search sampler (Optuna's, not the LLM's) and how many trials it plans
  breaches        searching samplers kept off regions where health rules fired
  preflight       every reachable configuration composed and validated before the first trial
  eval_power      what a sweep cannot learn (an eval too small, completions cut at max_tokens)
  sweep_plan      the plan: the above put together, and the study's name
study/       where the plan lives, shared by every worker (the storage itself is
             records/optuna_storage.py)
  create          create or join the study and its MLflow parent run
  slots           the plan as queued trials (slots) that workers take one at a time
  recovery        trials lost to the infrastructure, told apart from trials that failed
  heartbeat       heartbeats for the trials in flight, from the sweeper's process
sweep/       running the plan
  loop            the take -> launch -> tell loop Hydra's Sweeper hands over to (SweepRunner)
  start           the study opened (or joined) before the loop, and the plan said
  flights         a configuration in flight, its jobs and each job's Hydra overrides
  tell            a configuration's outcome into the study and MLflow, or its point queued again
  tuned           tuned/<study>.yaml, rewritten on each new best trial
  devices         one job per GPU from a device pool
  job             each job's task function: one seed trained, reported to MLflow and Optuna,
                  pruned when a health rule (trainer/run/health/) fires or the objective
                  pruner says so
  stopping        how a job stops its trial early: TrialPruned with the breach, the
                  objective pruner (median, hyperband) its trial asks
  forecaster      pruner=forecast: a trial's eval curve forecast, pruned when it cannot win
  signals         process signals (SIGTERM, SIGHUP) interrupt like Ctrl-C; job processes end
  trial_process   the process the command starts first, which loads what a trial needs while
                  the sweep starts, then runs the basic launcher's jobs
  packs           hydra.sweeper.pack: several of those jobs trained as one pack on one base
                  model (trainer/packed/), each still a trial of its own
  racing          seeds=auto: more seeds only where they can change the verdict
  terminator      terminator=true: stop a search when nothing more is to gain
results/     what a sweep leaves and shows
  runs            the sweep's MLflow runs and how each one ends
  display         the study's trial counts, the progress line after each trial, the final table
optuna_adapter  every use of Optuna's and Hydra's non-public API, in one place (beside the
                stages, below every one)

`SweepError` below is the one error a user sees (one line, exit code 1), and `__main__` the
`python -m sweeper` entry point. Hydra finds the Sweeper class in hydra_plugins/grpo_sweeper/,
which registers the settings schema and calls plan.sweep_plan, then sweep.loop.

The records a sweep writes (keys, tags, states) and the stores it writes them to are
records/'s, the floor below every package; the training it runs is trainer/'s.
"""


class SweepError(Exception):
    """The one error a user sees from the sweeper: a setting or search space that cannot
    work. One line naming what and why; the command exits with code 1."""
