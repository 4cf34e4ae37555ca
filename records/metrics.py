"""The names of the metrics the trainer logs, defined once (docs/records.md lists them), and
of the params a run decides as it loads (beside its hyperparameters).

Reporters, the sweeper's health rules and the analysis import these rather than spelling
them again.
"""

import math

REWARD = "reward/mean"  # mean reward of the step's rollouts
REWARD_STD = "reward/std"
REWARD_TIMEOUTS = "reward/timeouts"  # reward calls past task.reward_timeout, each scored 0
KL_SAMPLE_TRAIN_V1 = "kl_sample_train_v1"
KL_SAMPLE_TRAIN_V2 = "kl_sample_train_v2"
KL_PRE_POST_V1 = "kl_pre_post_v1"
KL_PRE_POST_V2 = "kl_pre_post_v2"
KL_POLICY_REF = "kl_policy_ref"  # logged with a KL penalty only
# What each KL measures (d = logp_sampler - logp_learner on action tokens), for the figures
# and tables that name one; its keys are the KL metrics.
KL_MEANING = {
    KL_SAMPLE_TRAIN_V1: "sampler-vs-learner KL, mean(d)",
    KL_SAMPLE_TRAIN_V2: "sampler-vs-learner KL, 0.5 mean(d^2)",
    KL_PRE_POST_V1: "post-update KL (sampler vs the learner after the step's updates), mean(d)",
    KL_PRE_POST_V2: "post-update KL (sampler vs the learner after the step's updates), "
    "0.5 mean(d^2)",
    KL_POLICY_REF: "KL from the reference policy (drift)",
}
ENTROPY = "entropy"
LOSS = "loss"
GRAD_NORM = "grad_norm"
LR = "lr"

# Where a step's time goes, in seconds (sampling includes scoring; train is the rest).
TIME_SAMPLE = "time/sample_s"
TIME_TRAIN = "time/train_s"
TIME_FORWARD_BACKWARD = "time/forward_backward_s"  # of train: the learner's passes
TIME_OPTIMIZER = "time/optimizer_s"  # of train: clipping and the optimizer's steps
TIME_REFERENCE = "time/reference_s"  # of train: the reference's forward (KL penalty only)
TIME_POST_KL = "time/post_kl_s"  # of train: the post-update KL's forward (compute_post_kl)
ROLLOUTS_PER_S = "throughput/rollouts_per_s"

# Shares of the step's groups by reward: mixed (some rollouts better than others: the only
# groups with an advantage to learn from), all rewarded, none rewarded.
GROUPS_MIXED = "groups/frac_mixed"
GROUPS_ALL_GOOD = "groups/frac_all_good"
GROUPS_ALL_BAD = "groups/frac_all_bad"
GROUPS_ZERO_ADVANTAGE = "groups/frac_zero_advantage"  # all_good + all_bad: nothing to learn

# The step's completions: mean length in tokens, and the share cut at max_tokens (no
# end-of-sequence) - what the length blow-up and truncation rules read.
COMPLETION_LENGTH = "completions/mean_length"
COMPLETIONS_TRUNCATED = "completions/truncated"

# The async pipeline's rollouts: how many updates old the trained ones were, and how many were
# discarded as older than max_steps_off_policy.
ASYNC_STALE_MEAN = "async/stale_mean"
ASYNC_STALE_MAX = "async/stale_max"
ASYNC_DISCARDED = "async/discarded"

# Held-out eval, at step 0 (the baseline), every eval_every steps, at the end, and where the
# health rules ask (HealthMonitor.wants_eval). A mean's standard error over problems sits
# beside it (`stderr_of`).
EVAL_REWARD = "eval/reward/mean"  # sampled completions (eval_samples per problem)
EVAL_GREEDY = "eval/greedy/mean"  # greedy decoding on the same problems (eval_greedy)
EVAL_TRUNCATED = "eval/truncated"  # share of sampled eval completions cut at max_tokens
# Mean reward of the sampled eval completions that ended before max_tokens (absent when none
# did): what the model answers, apart from learning to answer within max_tokens.
EVAL_UNTRUNCATED = "eval/untruncated_reward"

# Params a run decides on this host and records beside its hyperparameters.
ONEDNN_PARAM = "onednn"  # on | off: float32 linear layers computed through oneDNN
THREADS_PARAM = "threads"  # the CPU threads torch computed with (trainer/model/cpu_threads.py)


def stderr_of(mean_metric: str) -> str:
    """`eval/reward/mean` -> `eval/reward/stderr`."""
    return mean_metric.removesuffix("/mean") + "/stderr"


def reward_part(name: str) -> str:
    """The metric of one of the task's rewards, beside the total: `reward/last_number`."""
    return f"reward/{name}"


def eval_reward_part(name: str) -> str:
    """One reward's held-out mean over the sampled eval completions: `eval/reward/last_number`."""
    return f"eval/reward/{name}"


def all_cut(truncated) -> bool:
    """A share cut at max_tokens (EVAL_TRUNCATED) of 1: every completion hit max_tokens
    before it ended, so the rewards scored cut-off answers."""
    return is_finite_number(truncated) and truncated >= 1.0


def is_finite_number(value) -> bool:
    """A metric value that can be compared: a real number, not NaN or inf. A bool is not one
    (it is an int to Python), so a flag never passes for a measurement."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# What a person reads for a metric in a figure or on a page; the name it is logged under goes
# beside it once (`titled`). A metric not named here is shown as it is logged.
READABLE = {
    REWARD: "training reward",
    EVAL_REWARD: "held-out reward",
    EVAL_GREEDY: "held-out reward, greedy decoding",
    EVAL_TRUNCATED: "share of eval completions cut at max_tokens",
    KL_SAMPLE_TRAIN_V1: "sampler-vs-learner KL",
    KL_SAMPLE_TRAIN_V2: "sampler-vs-learner KL",
    KL_PRE_POST_V1: "KL of one update (before vs after)",
    KL_PRE_POST_V2: "KL of one update (before vs after)",
    KL_POLICY_REF: "KL from the reference policy",
}


def readable(metric: str) -> str:
    """`held-out reward` for `eval/reward/mean`; an unnamed metric as it is logged."""
    return READABLE.get(metric, metric)


def titled(metric: str) -> str:
    """`held-out reward (eval/reward/mean)`: the readable name with the logged one beside it."""
    return f"{READABLE[metric]} ({metric})" if metric in READABLE else metric
