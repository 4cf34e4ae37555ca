"""One GRPO step, the part every pipeline shares (trainer/rl/pipelines.py decides how the
groups arrive: all at once, streamed, or sampled ahead).

  sample_groups      group_size rollouts of each problem, each scored by the task -> Groups
  train_on_groups    the rest, in this order:
    prepare          advantages: each reward minus its group's mean (optionally over its std),
                     on every completion token; with a KL penalty, shaped toward the reference
                     (the base model: LoRA's adapter off, or a frozen copy)
    backward         per minibatch of whole groups: the learner's token log-probs, the loss
                     (trainer/rl/losses.py), its gradient
    optimizer_step   clip the gradient, one optimizer step
    step_metrics     rewards, the updates' averages, and the post-update KL: the sampler's
                     log-probs against the updated policy's, on the step's own rollouts

Simplified: one reward per completion, one epoch over each batch, the sampler's log-probs are
the importance ratio's old policy (not recomputed), no value model. Shapes come from the
groups, never from the config, so a streamed or partial batch trains through the same code.
Left out of this file, the speed. What the step asks of the policy, `collate`
(trainer/model/token_batch.py), `Policy.logprobs` and `Policy.learner_pieces`, is said in plain
words in trainer/model/policy.py; behind them, trainer/model/fast_logprobs.py runs micro-batches
sized to memory, packed groups or a shared prompt cache and the output layer in chunks (on the
merged LoRA copy the policy hands it), and trainer/model/plain_logprobs.py computes the same
log-probs with one plain forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from records import metrics as metrics_names
from trainer.base.timing import timed
from trainer.env.rewards import reward_part_means, score_batch
from trainer.env.tasks import Problem, Task
from trainer.model.policy import Policy
from trainer.model.rollout import Rollout
from trainer.model.token_batch import TokenBatch, collate
from trainer.rl import rl_math
from trainer.rl.losses import LossInputs, get_loss
from trainer.sampling.protocol import Sampler, SamplingSettings


class NonFiniteError(FloatingPointError):
    """NaN or inf in rewards, log-probs, the loss or the gradients: the run cannot recover."""


# What each minibatch update reports, averaged over the step's minibatches.
UPDATE_METRICS = (
    metrics_names.LOSS,
    metrics_names.GRAD_NORM,
    metrics_names.KL_SAMPLE_TRAIN_V1,
    metrics_names.KL_SAMPLE_TRAIN_V2,
    metrics_names.ENTROPY,
)
UPDATE_SECONDS = (metrics_names.TIME_FORWARD_BACKWARD, metrics_names.TIME_OPTIMIZER)


@dataclass
class Groups:
    """Rollout groups to train on: P problems x G rollouts each, rollouts grouped by problem."""

    problems_P: list[Problem]
    rollouts_N: list[Rollout]
    rewards_PG: torch.Tensor
    versions_P: list[int]  # the policy version (step) whose weights sampled each group
    sample_s: float  # seconds spent sampling and scoring them
    reward_timeouts: int | None = None  # reward calls past task.reward_timeout (None: no limit)

    def __len__(self) -> int:
        return len(self.problems_P)

    @classmethod
    def join(cls, parts: list[Groups]) -> Groups:
        return cls(
            [p for g in parts for p in g.problems_P],
            [r for g in parts for r in g.rollouts_N],
            torch.cat([g.rewards_PG for g in parts]),
            [v for g in parts for v in g.versions_P],
            sum(g.sample_s for g in parts),
            None if parts[0].reward_timeouts is None else sum(g.reward_timeouts for g in parts),
        )


def sample_groups(
    cfg: DictConfig,
    sampler: Sampler,
    task: Task,
    problems_P: list[Problem],
    settings: SamplingSettings,
    version: int,
) -> Groups:
    """group_size rollouts of each problem, scored by the task."""
    seconds: dict[str, float] = {}
    with timed(seconds, metrics_names.TIME_SAMPLE):
        group_size = cfg.group_size  # read once: each DictConfig lookup costs microseconds
        prompts_N = [p.prompt for p in problems_P for _ in range(group_size)]
        rollouts_N = sampler.sample(prompts_N, settings)
        calls = [
            (problems_P[i // group_size], r.text, r.finished) for i, r in enumerate(rollouts_N)
        ]
        scored, timeouts = score_batch(task, calls)
        rewards_N = []
        for r, (reward, parts) in zip(rollouts_N, scored, strict=True):
            r.reward_parts = parts  # each reward's own score rides on its rollout
            rewards_N.append(reward)
        rewards_PG = torch.tensor(rewards_N, dtype=torch.float32).view(len(problems_P), group_size)
        require_finite("reward", rewards_PG)
    versions = [version] * len(problems_P)
    sample_s = seconds[metrics_names.TIME_SAMPLE]
    return Groups(problems_P, rollouts_N, rewards_PG, versions, sample_s, timeouts)


@dataclass
class Prepared:
    """Groups as tensors with their advantages: what the updates read."""

    batch: TokenBatch
    advantages_NT: torch.Tensor
    mask_NT: torch.Tensor  # tokens that carry gradient
    keep_P: torch.Tensor | None  # groups kept (remove_constant_reward_groups)
    metrics: dict[str, float]


def prepare(cfg: DictConfig, policy: Policy, groups: Groups) -> Prepared:
    """Advantages centred within each group, broadcast to every action token, and shaped by
    the KL penalty toward the reference (the base model, adapter off). Shapes come from the
    groups, never from the config: a pipeline may hand over any number of them."""
    batch = collate(groups.rollouts_N, policy.tokenizer.pad_token_id).to(policy.device)
    require_finite("sampler logprob", batch.sampler_logp_NT)
    advantages_N = rl_math.compute_advantages(groups.rewards_PG, cfg.scale_rewards).view(-1, 1)
    advantages_NT = advantages_N.to(policy.device) * batch.mask_NT
    metrics: dict[str, float] = {}
    if cfg.kl_penalty_coef > 0:
        with timed(metrics, metrics_names.TIME_REFERENCE):
            ref_logp_NT = policy.logprobs(batch, cfg.temperature, "reference")
        shaping_NT, metrics[metrics_names.KL_POLICY_REF] = rl_math.kl_penalty(
            batch.sampler_logp_NT,
            ref_logp_NT,
            batch.mask_NT,
            cfg.kl_penalty_coef,
            cfg.kl_discount_factor,
        )
        advantages_NT = advantages_NT + shaping_NT
    mask_NT = batch.mask_NT
    if cfg.loss.mask_truncated_completions:
        mask_NT = mask_NT * batch.finished_N[:, None]
    keep_P = None
    if cfg.remove_constant_reward_groups:
        keep_P = ~rl_math.constant_groups(groups.rewards_PG)
    return Prepared(batch, advantages_NT, mask_NT, keep_P, metrics)


def train_on_groups(
    cfg: DictConfig,
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    groups: Groups,
    num_substeps: int,
) -> dict[str, float]:
    """The training step every pipeline shares: num_substeps minibatches of whole groups,
    one optimizer step each, then the post-update KL on the groups' own rollouts."""
    seconds: dict[str, float] = {}
    with timed(seconds, metrics_names.TIME_TRAIN):
        prepared = prepare(cfg, policy, groups)
        keep_P = prepared.keep_P
        rows_M = rl_math.minibatch_rows(len(groups), cfg.group_size, num_substeps, keep_P)
        updates = []
        for rows in rows_M:
            update = backward(cfg, policy, prepared, rows)
            optimizer_step(cfg, policy, optimizer, update)
            updates.append(update)
        metrics = step_metrics(cfg, policy, optimizer, groups, prepared.batch, updates)
    train_s = seconds[metrics_names.TIME_TRAIN]
    return {**metrics, **prepared.metrics, **timing(groups, train_s)}


def step_metrics(
    cfg: DictConfig,
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    groups: Groups,
    batch: TokenBatch,
    updates: list[dict[str, float]],
) -> dict[str, float]:
    """What a step reports after its updates, whatever the pipeline: the groups' rewards, the
    updates' averages, the lr, and the post-update KL on the step's own rollouts (`batch`)."""
    metrics = {**group_metrics(groups), **average_updates(updates)}
    metrics[metrics_names.LR] = optimizer.param_groups[0]["lr"]
    # How far the updates moved the policy on its own data (tinker's post-KL): on-policy with
    # one update the sampler-train KL is ~1e-13, this one is what a too-high lr blows up.
    if cfg.compute_post_kl:
        with timed(metrics, metrics_names.TIME_POST_KL):
            metrics.update(post_update_kl(policy, batch, cfg))
    return metrics


def group_metrics(groups: Groups) -> dict[str, float]:
    timeouts = groups.reward_timeouts
    return {
        **({} if timeouts is None else {metrics_names.REWARD_TIMEOUTS: float(timeouts)}),
        metrics_names.REWARD: groups.rewards_PG.mean().item(),
        metrics_names.REWARD_STD: groups.rewards_PG.std().item(),
        **rl_math.group_outcome_fractions(groups.rewards_PG),
        **reward_part_means(groups.rollouts_N),
        **completion_metrics(groups.rollouts_N),
    }


def completion_metrics(rollouts_N: list[Rollout]) -> dict[str, float]:
    n = max(len(rollouts_N), 1)
    return {
        metrics_names.COMPLETION_LENGTH: sum(len(r.completion_ids) for r in rollouts_N) / n,
        metrics_names.COMPLETIONS_TRUNCATED: sum(not r.finished for r in rollouts_N) / n,
    }


def timing(groups: Groups, train_s: float) -> dict[str, float]:
    return {
        metrics_names.TIME_SAMPLE: groups.sample_s,
        metrics_names.TIME_TRAIN: train_s,
        metrics_names.ROLLOUTS_PER_S: len(groups.rollouts_N) / (groups.sample_s + train_s),
    }


def backward(
    cfg: DictConfig, policy: Policy, prepared: Prepared, rows: torch.Tensor, scale: float = 1.0
) -> dict[str, float]:
    """Forward and backward on the given rollouts (a minibatch), in the policy's micro-batches
    (at most learner_batch_tokens tokens each); gradients accumulate until the step.

    Each piece's loss is normalised by the whole minibatch's sequences and tokens, so the
    pieces' gradients sum to the minibatch's. `scale` divides a minibatch's loss when several
    make up one optimizer step (streaming). A non-finite loss is reported, not backpropagated.
    """
    seconds: dict[str, float] = {}
    with timed(seconds, metrics_names.TIME_FORWARD_BACKWARD):
        batch, rows = prepared.batch, rows.to(policy.device)
        num_sequences, num_tokens = len(rows), prepared.mask_NT[rows].sum()
        loss_fn = get_loss(cfg.loss.name)
        losses, logp, entropy = [], [], []
        for piece, logp_NT, entropy_NT in policy.learner_pieces(batch, rows, cfg.temperature):
            require_finite("learner logprob", logp_NT[batch.mask_NT[piece].bool()])
            inputs = LossInputs(
                logp_NT,
                batch.sampler_logp_NT[piece],
                prepared.advantages_NT[piece],
                prepared.mask_NT[piece],
                cfg.max_tokens,
                num_sequences,
                num_tokens,
            )
            loss = loss_fn(inputs, cfg.loss)
            if torch.isfinite(loss):
                (loss * scale).backward()
            losses.append(loss.detach())
            logp.append(logp_NT.detach())
            entropy.append(entropy_NT)
        logp_NT, minibatch = torch.cat(logp), batch.select(rows)
        # Sampler-vs-learner KL on this minibatch, before its own update took effect.
        kl_v1, kl_v2 = rl_math.kl_sample_train(
            minibatch.sampler_logp_NT, logp_NT, minibatch.mask_NT
        )
        entropy_mean = rl_math.masked_mean(torch.cat(entropy), minibatch.mask_NT).item()
        update = {
            metrics_names.LOSS: sum(losses).item(),
            metrics_names.KL_SAMPLE_TRAIN_V1: kl_v1,
            metrics_names.KL_SAMPLE_TRAIN_V2: kl_v2,
            metrics_names.ENTROPY: entropy_mean,
        }
    return {**update, **seconds}


def optimizer_step(
    cfg: DictConfig, policy: Policy, optimizer: torch.optim.Optimizer, *updates: dict[str, float]
) -> float:
    """Clip and apply the gradients the updates' backward passes accumulated, and record the
    step in them: the gradient norm in each, the step's time in the first. Returns the norm.
    Nothing moves when a loss or the gradient is not finite: NaN never reaches the weights."""
    with timed(updates[0], metrics_names.TIME_OPTIMIZER):
        grad_norm = math.nan
        if all(math.isfinite(u[metrics_names.LOSS]) for u in updates):
            max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
            parameters = policy.trainable_parameters()
            grad_norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm).item()
        if math.isfinite(grad_norm):
            optimizer.step()
            policy.weights_changed()
        optimizer.zero_grad(set_to_none=True)
        for update in updates:
            update[metrics_names.GRAD_NORM] = grad_norm
    return grad_norm


@torch.inference_mode()  # as the sampler runs; only two floats leave it
def post_update_kl(policy: Policy, batch: TokenBatch, cfg: DictConfig) -> dict[str, float]:
    """kl_pre_post_v1/v2: the sampler's log-probs vs the learner's after the step's updates."""
    # As the next sampling will see the policy: merged, no dropout.
    post_logp_NT = policy.logprobs(batch, cfg.temperature, "inference")
    v1, v2 = rl_math.kl_sample_train(batch.sampler_logp_NT, post_logp_NT, batch.mask_NT)
    return {metrics_names.KL_PRE_POST_V1: v1, metrics_names.KL_PRE_POST_V2: v2}


def average_updates(updates: list[dict[str, float]]) -> dict[str, float]:
    """Mean over the step's minibatches (times: the sum). With none (all groups filtered)
    nothing was trained on, so nothing is measured: no loss, entropy, gradient or KL value (a
    0 would read as a collapsed entropy to the health rules)."""
    times = {key: sum(u.get(key, 0.0) for u in updates) for key in UPDATE_SECONDS}
    if not updates:
        return times
    return {**{key: sum(u[key] for u in updates) / len(updates) for key in UPDATE_METRICS}, **times}


def require_finite(name: str, values: torch.Tensor) -> None:
    if not torch.isfinite(values).all():
        raise NonFiniteError(f"{name} is not finite (NaN or inf); lower lr or check the reward")
