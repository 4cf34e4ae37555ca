"""Settings of the GRPO sweeper (`hydra.sweeper.*`), registered as `hydra/sweeper=grpo_optuna`.

Every field can be set on the command line, e.g. `hydra.sweeper.n_trials=20`. Kept free of
heavy imports: Hydra imports this module whenever it scans its plugins.
"""

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore


@dataclass
class GRPOSweeperConf:
    _target_: str = "hydra_plugins.grpo_sweeper.grpo_sweeper.GRPOSweeper"

    # --- search ---
    # Search-space presets, {key: spec}, e.g. {lr: "tag(log, interval(1e-4, 1e-2))"}; the
    # command line wins for a key given in both. conf/search/*.yaml fill this in.
    params: dict[str, str] = field(default_factory=dict)
    # auto: only discrete choices -> grid (each combination once), any range -> tpe.
    # Or: grid, tpe, random, gp, cmaes.
    sampler: str = "auto"
    seed: int | None = None  # seeds tpe/random/gp/cmaes; the grid order is always fixed
    direction: str = "maximize"  # maximize or minimize the objective
    objective: str = "eval/reward/mean"  # metric returned by a trial: its last value
    n_trials: int = 20  # trials in total for tpe/random/gp/cmaes (all workers together)
    n_jobs: int = 1  # trials launched per batch (the launcher may run them in parallel)
    # The sweep stops once failed trials exceed this fraction of the planned trials
    # (n_trials, or the grid size). Pruned trials are not failures.
    max_failure_rate: float = 0.5
    # A grid with more points than this stops before it starts: a typo such as lr=range(1,1000)
    # should not queue a thousand trials. Raising it is the confirmation.
    max_grid_size: int = 100

    # --- where the study lives ---
    storage: str = "sqlite:///sweeps.db"  # Optuna RDB URL; PostgreSQL to share across hosts
    # null: "grpo-<hash of the sorted overrides and search settings>", so the same command
    # resumes the same study.
    study_name: str | None = None
    heartbeat_interval: int = 30  # seconds between heartbeats of running trials
    grace_period: int | None = None  # a trial is stale after this long silent (2 x interval)
    fail_stale_trials: bool = True  # fail stale trials on start and rerun their points

    # --- pruning ---
    # A trial is pruned once `kl_metric` exceeds `kl_threshold` on `kl_patience` consecutive
    # steps after `kl_warmup_steps`. kl_sample_train_v2 = 0.5 mean(d^2) is never negative and
    # has less variance than v1 = mean(d), whose positive and negative token terms cancel; the
    # 0.01 rule of thumb is about this sampler-vs-learner KL. kl_policy_ref (the drift from the
    # reference, only logged when kl_penalty_coef > 0) is the other option.
    kl_metric: str = "kl_sample_train_v2"
    kl_threshold: float | None = None  # null: the job config's kl_threshold (0.01)
    kl_patience: int = 1  # consecutive steps over the threshold before pruning
    kl_warmup_steps: int = 0  # steps exempt from the KL check at the start
    # Pruning on the objective at eval steps: none, median or hyperband.
    pruner: str = "none"
    pruner_warmup_steps: int = 1  # no objective pruning before this step (0 is the baseline)


ConfigStore.instance().store(
    group="hydra/sweeper", name="grpo_optuna", node=GRPOSweeperConf, provider="grpo_sweeper"
)
