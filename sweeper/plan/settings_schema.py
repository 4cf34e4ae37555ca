"""Settings of the GRPO sweeper (`hydra.sweeper.*`), the schema Hydra's plugin registers as
`hydra/sweeper=grpo_optuna` (hydra_plugins/grpo_sweeper/grpo_sweeper.py).

Every field can be set on the command line, e.g. `hydra.sweeper.n_trials=20`. Choices are
Enums, so a misspelt one fails when Hydra composes the config; the other rules are checked
once, in sweeper/plan/settings.py. Kept free of heavy imports: Hydra imports this module whenever
it scans its plugins.
"""

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from records.defaults import DEFAULT_STORAGE
from records.metrics import EVAL_REWARD


class Sampler(str, Enum):
    auto = "auto"  # only discrete choices -> grid (each combination once), any range -> tpe
    grid = "grid"
    tpe = "tpe"
    random = "random"
    gp = "gp"
    cmaes = "cmaes"


class Direction(str, Enum):
    maximize = "maximize"
    minimize = "minimize"


class Pruner(str, Enum):
    """Pruning on the objective at eval steps, on top of the health rules."""

    none = "none"
    median = "median"
    hyperband = "hyperband"
    forecast = "forecast"  # extrapolates the eval curve (judge/forecast.py)


@dataclass
class GRPOSweeperConf:
    _target_: str = "hydra_plugins.grpo_sweeper.grpo_sweeper.GRPOSweeper"

    # --- search ---
    # Search-space presets, {key: spec}, e.g. {lr: "tag(log, interval(1e-4, 1e-2))"}; the
    # command line wins for a key given in both. conf/search/*.yaml fill this in.
    params: dict[str, str] = field(default_factory=dict)
    sampler: Sampler = Sampler.auto  # how Optuna picks points; auto: grid, or tpe for a range
    seed: int | None = None  # seeds tpe/random/gp/cmaes; the grid order is always fixed
    direction: Direction = Direction.maximize  # whether a higher objective is better
    objective: str = EVAL_REWARD  # metric returned by a trial: its last value
    n_trials: int = 20  # configurations in total for tpe/random/gp/cmaes (all workers)
    # Seeds per configuration: each runs N times (seed, seed+1, ...), its objective is the
    # mean over its seeds (what TPE learns from), and the verdict gives a confidence interval.
    # `auto` (the default) races them (judge/race.py): 2 seeds each, then one more at
    # a time only for configurations the verdict cannot yet tell apart from the leader and
    # that one more seed could still separate by min_difference, up to max_seeds, and on a
    # grid only while budget_seeds leaves room. Replayed on recorded grids it spends about
    # two thirds of a 3-seed grid with the same health rules, with a 2-seed grid's picks
    # (bench/COST.md, first section: held-out figures and the regret).
    # seeds=1 is the plain one-run grid; the search presets pin it.
    seeds: Any = "auto"
    # Training runs at once. With hydra/launcher=joblib (or a cluster launcher) each runs in
    # its own process, and a slot freed by a pruned or finished run is refilled at once. The
    # basic launcher runs one at a time, in the trial process (sweeper/sweep/trial_process.py).
    n_jobs: int = 1
    # Packed trials (trainer/packed/): up to this many jobs run as one, in lockstep on one
    # base model, each still its own trial, MLflow run and checkpoints; jobs that cannot share
    # a model (another model, LoRA rank or targets, sampler) run one at a time as with 1.
    # The basic launcher only. 1 (no packing) is the default because a pack is slower than
    # its trials one at a time on a 2-core CPU at the default shapes (bench/PACKED.md).
    # auto: K from what was measured: on a CPU, packs only small batches (bench/PACKED.md);
    # on a GPU, as many members as its free memory holds (sweeper/plan/pack_size.py).
    pack: Any = 1
    # One run per GPU: a pool such as [cuda:0, cuda:1] (or [0, 1]); each run at once gets its
    # own device as model.device and gives it back when it ends. null: no pool.
    devices: list[str] | None = None
    # The sweep stops once failed trials exceed this fraction of the planned trials
    # (n_trials, or the grid size). Pruned trials are not failures.
    max_failure_rate: float = 0.5
    # A grid with more points than this stops before it starts: a typo such as lr=range(1,1000)
    # should not queue a thousand trials. Raising it is the confirmation.
    max_grid_size: int = 100

    # --- racing seeds (seeds=auto) and when a search stops ---
    # Most seeds one configuration gets with seeds=auto; the verdict calls configurations
    # still not separated at this many seeds a tie and says how many more it would take.
    max_seeds: int = 3
    # The smallest difference in the objective worth more seeds with seeds=auto: a race stops
    # as tied once even the optimistic difference (its 95% upper confidence bound) is below it,
    # or a difference this large could not be separated within max_seeds seeds each at the
    # study's pooled seed variance, and a configuration behind the leader stops
    # once even its 95% upper bound could not beat the leader by it. null: the eval's standard
    # error over problems, averaged over the seeds run (a difference one run's eval cannot see);
    # 0: only the optimistic bound stops a race. In the objective's units (e.g. 0.02 = 2 points).
    min_difference: float | None = None
    # A grid raced with seeds=auto spends at most the training steps of a grid of this many
    # seeds: a seed past the first two runs only where the health rules' early stops left
    # room (it waits while runs that might stop early are still going). So a small grid, where
    # nothing stops early, costs a 2-seed grid. 0: no cap (max_seeds alone bounds the race).
    budget_seeds: int = 2
    # Searches (tpe, gp, random, cmaes) only: end the study before n_trials once the best
    # configuration cannot plausibly be beaten by more than its noise: Optuna's regret bound
    # (how much better any untried point could plausibly be) below the best's standard error
    # (over its seeds, or over eval problems with one seed). sweeper/sweep/terminator.py says why
    # these two; the reason is recorded on the study, its MLflow run and in the verdict.
    terminator: bool = False
    # Completed configurations before the terminator looks: the regret bound comes from a
    # Gaussian process fitted to them, which a handful of points cannot pin down.
    terminator_min_trials: int = 5

    # --- where the study lives ---
    storage: str = DEFAULT_STORAGE  # Optuna RDB URL; PostgreSQL to share across hosts
    # null: "grpo-<hash of the sorted overrides and search settings>", so the same command
    # resumes the same study.
    study_name: str | None = None
    heartbeat_interval: int = 30  # seconds between heartbeats of running trials
    grace_period: int | None = None  # a trial is stale after this long silent (2 x interval)
    fail_stale_trials: bool = True  # fail stale trials on start and rerun their points

    # --- when the infrastructure fails (a database restart, a dead worker) ---
    # Seconds every store (Optuna's storage, MLflow's tracking database) is retried, with
    # backoff, once it stops answering; then the worker stops with one line saying the
    # database is unreachable, and the same command resumes. null: 120 s
    # (records/database.py: DEFAULT_RETRY_S). A store that fails at the sweep's start is bad
    # input: it fails at once.
    db_retry_seconds: float | None = None
    # A trial lost to the infrastructure (its database stayed away, its process or worker
    # died) is recorded interrupted, not failed, and its point is queued again to resume from
    # its last checkpoint; the same point lost this many times in a row, with no new checkpoint
    # between the losses, fails with the reason (a run that kills its own worker, e.g. out of
    # memory, cannot loop forever).
    max_lost_in_a_row: int = 3

    # --- pruning ---
    # Health rules checked after every training step; the first that fires prunes the trial
    # and is recorded (rule, value, bound, step). null: the calibrated defaults of
    # trainer/run/health/ (KL past kl_threshold, non-finite loss or grad norm, collapse signs);
    # [] turns health pruning off. Each rule: {name, metric, check (above, below, not_finite,
    # below_baseline, below_peak, ratio_below, ratio_above), bound, patience, warmup_steps,
    # advice, action (prune, warn), guard (none, not_rising, rising,
    # not_improved), guard_metric, rise.
    health: Any = None
    kl_threshold: float | None = None  # null: the training config's kl_threshold
    pruner: Pruner = Pruner.none
    pruner_warmup_steps: int = 1  # no objective pruning before this step (0 is the baseline)
    # pruner=forecast: a trial is pruned once its optimistic forecast at this one-sided level
    # falls short of the best completed configuration's pessimistic value at the same level.
    forecast_level: float = 0.75  # calibrated in bench/FORECAST.md
