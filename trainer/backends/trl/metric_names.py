"""TRL's logged metric names as ours: the ones with the same meaning under our names
(`SAME_MEANING`), every other under `trl/<name>`; read by the backend's callback, the health
callback of a user's own script and the analysis of a TRL run's MLflow metrics.
"""

from __future__ import annotations

from records import metrics as metrics_names

# TRL's logged name -> ours, where the meaning is the same; the rest go under `trl/<name>`.
SAME_MEANING = {
    "reward": metrics_names.REWARD,
    "reward_std": metrics_names.REWARD_STD,
    "entropy": metrics_names.ENTROPY,
    "kl": metrics_names.KL_POLICY_REF,  # TRL's beta term: the policy vs its reference
    "loss": metrics_names.LOSS,
    "grad_norm": metrics_names.GRAD_NORM,
    "learning_rate": metrics_names.LR,
    metrics_names.COMPLETION_LENGTH: metrics_names.COMPLETION_LENGTH,  # TRL logs it as we do
    "completions/clipped_ratio": metrics_names.COMPLETIONS_TRUNCATED,  # cut at max length
}
TRL_PREFIX = "trl/"
TRAIN_SUMMARY = "train_runtime"  # in the log TRL writes once training ended: not a step's


def our_metrics(logs: dict[str, float]) -> dict[str, float]:
    """TRL's logs under our names; a value TRL logged as None (nothing to average) is left
    out, never reported as 0. Not `frac_reward_zero_std` as the groups' shares: with
    scale_rewards=batch it is one batch-level 0/1 flag (`group_rewards` gives them)."""
    metrics: dict[str, float] = {}
    for name, value in logs.items():
        if value is None or isinstance(value, str):
            continue
        if name.startswith("rewards/") and name.endswith("/mean"):
            metrics[metrics_names.reward_part(name.split("/")[1])] = value
        metrics[SAME_MEANING.get(name, TRL_PREFIX + name)] = float(value)
    return metrics


def logged_as_ours(name: str) -> str:
    """A metric name as logged to MLflow, by TRL's `report_to` or by us, under our name."""
    if name.startswith("rewards/") and name.endswith("/mean"):
        return metrics_names.reward_part(name.split("/")[1])
    return SAME_MEANING.get(name, name)
