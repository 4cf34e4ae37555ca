"""How rollout groups reach the training step: sync, stream and async differ only there.

Every pipeline trains with the same functions of trainer/rl/step.py (`sample_groups`, `prepare`,
`backward`, `optimizer_step`, `step_metrics`, or all of them as `train_on_groups`); none copies
the loop.

  sync    sample the step's batch_size groups, then train on them (num_substeps minibatches)
  stream  sample a minibatch of groups and run its forward/backward at once, then the next;
          one optimizer step per substep after its num_minibatches minibatches. Each substep
          samples with the weights it trains, so it is strictly on-policy.
  async   a sampler thread keeps producing groups with the weights it has while the learner
          trains; the learner takes groups_per_batch groups per update, discarding (and
          resampling the problem of) any group more than max_steps_off_policy updates old.
"""

from __future__ import annotations

import copy
import queue
import random
import threading
import time
from collections import deque
from typing import Protocol

import torch

from records import metrics as metrics_names
from trainer.env.tasks import Problem
from trainer.model.policy import Policy
from trainer.model.token_batch import collate
from trainer.rl.pipeline_settings import groups_per_batch
from trainer.rl.rl_math import minibatch_rows
from trainer.rl.step import (
    Groups,
    backward,
    optimizer_step,
    prepare,
    sample_groups,
    step_metrics,
    timing,
    train_on_groups,
)
from trainer.sampling.factory import make_sampler


class Pipeline(Protocol):
    def step(self, step: int) -> dict[str, float]:
        """Train one step (its number, from 1); return its metrics."""

    def close(self) -> None:
        """Stop any background work."""


def chunks(items: list, parts: int) -> list[list]:
    """items split into `parts` contiguous, equal parts (the caller checked divisibility)."""
    size = len(items) // parts
    return [items[i * size : (i + 1) * size] for i in range(parts)]


class SyncPipeline:
    def __init__(self, cfg, policy, sampler, task, optimizer, rng, settings) -> None:
        self.cfg, self.policy, self.sampler, self.task = cfg, policy, sampler, task
        self.optimizer, self.rng, self.settings = optimizer, rng, settings

    def step(self, step: int) -> dict[str, float]:
        self.sampler.sync_weights()  # a separate inference engine (vLLM) gets the weights
        problems = self.task.train_problems(self.cfg.batch_size, self.rng)
        groups = sample_groups(self.cfg, self.sampler, self.task, problems, self.settings, step - 1)
        return train_on_groups(self.cfg, self.policy, self.optimizer, groups, self.cfg.num_substeps)

    def close(self) -> None:
        pass


class StreamPipeline(SyncPipeline):
    def step(self, step: int) -> dict[str, float]:
        cfg, started = self.cfg, time.perf_counter()
        problems = self.task.train_problems(groups_per_batch(cfg), self.rng)
        parts: list[Groups] = []
        updates: list[dict[str, float]] = []
        reference: list[dict[str, float]] = []
        for substep in chunks(problems, cfg.num_substeps):
            self.sampler.sync_weights()
            in_step = []
            for minibatch in chunks(substep, cfg.num_minibatches):
                groups = sample_groups(
                    cfg, self.sampler, self.task, minibatch, self.settings, step - 1
                )
                prepared = prepare(cfg, self.policy, groups)
                reference.append(prepared.metrics)
                rows = minibatch_rows(len(groups), cfg.group_size, 1, prepared.keep_P)
                in_step += [
                    backward(cfg, self.policy, prepared, r, 1 / cfg.num_minibatches) for r in rows
                ]
                parts.append(groups)
            if in_step:
                optimizer_step(cfg, self.policy, self.optimizer, *in_step)
            updates += in_step
        batch = Groups.join(parts)
        # The post-update KL needs only the tokens: collated, not prepared again (no second
        # reference forward under a KL penalty).
        tokens = collate(batch.rollouts_N, self.policy.tokenizer.pad_token_id).to(
            self.policy.device
        )
        metrics = step_metrics(cfg, self.policy, self.optimizer, batch, tokens, updates)
        train_s = time.perf_counter() - started - batch.sample_s
        return {**metrics, **reference_metrics(reference), **timing(batch, train_s)}


def reference_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """The KL penalty's metrics of several equal minibatches prepared one at a time (stream):
    the policy-reference KL's mean, the reference forwards' total time."""
    parts = [m for m in parts if m]
    if not parts:
        return {}
    return {
        metrics_names.KL_POLICY_REF: sum(m[metrics_names.KL_POLICY_REF] for m in parts)
        / len(parts),
        metrics_names.TIME_REFERENCE: sum(m[metrics_names.TIME_REFERENCE] for m in parts),
    }


def split_by_age(
    groups: list[Groups], learner_version: int, max_steps_off_policy: int
) -> tuple[list[Groups], list[Groups]]:
    """(fresh enough, too old): a group is too old when more than max_steps_off_policy updates
    happened since the weights that sampled it."""
    fresh = [g for g in groups if learner_version - g.versions_P[0] <= max_steps_off_policy]
    old = [g for g in groups if learner_version - g.versions_P[0] > max_steps_off_policy]
    return fresh, old


def staleness(groups: Groups, learner_version: int) -> dict[str, float]:
    ages = [learner_version - v for v in groups.versions_P]
    return {
        metrics_names.ASYNC_STALE_MEAN: sum(ages) / len(ages),
        metrics_names.ASYNC_STALE_MAX: float(max(ages)),
    }


class AsyncPipeline:
    """Off-by-K: sampling and training overlap, on a copy of the policy for the sampler.

    The learner's sampler (the one evaluation uses) is not used here: the sampler thread
    needs weights that no update changes under it, so it gets its own copy and sampler,
    refreshed after each update."""

    def __init__(self, cfg, policy, _learners_sampler, task, optimizer, rng, settings) -> None:
        self.cfg, self.policy, self.task, self.optimizer = cfg, policy, task, optimizer
        self.settings = settings
        self.sampler_policy = Policy(
            copy.deepcopy(policy.model).eval().requires_grad_(False),
            policy.tokenizer,
            policy.device,
        )
        self.sampler = make_sampler(cfg.sampler.name, self.sampler_policy, cfg)
        self.rng = random.Random(rng.random())  # the sampler thread's own problem stream
        self.group_batch = max(1, groups_per_batch(cfg) // 4)  # groups sampled at a time
        self.version = 0  # updates the sampler's weights include
        # At most one batch ahead: a sampler running further ahead only makes stale groups.
        self.ready: queue.Queue[Groups] = queue.Queue(maxsize=groups_per_batch(cfg))
        self.resample: deque[Problem] = deque()  # problems of discarded groups
        self.weights = threading.Lock()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(
            target=self._sample_forever, name="async-sampler", daemon=True
        )
        self.thread.start()

    def _sample_forever(self) -> None:
        try:
            while not self.stop.is_set():
                problems = [
                    self.resample.popleft()
                    for _ in range(min(len(self.resample), self.group_batch))
                ]
                problems += self.task.train_problems(self.group_batch - len(problems), self.rng)
                with self.weights:  # one set of weights for the whole batch of groups
                    sampled = sample_groups(
                        self.cfg, self.sampler, self.task, problems, self.settings, self.version
                    )
                for i in range(len(sampled)):
                    while not self.stop.is_set():
                        try:
                            self.ready.put(_one(sampled, i), timeout=0.1)
                            break
                        except queue.Full:
                            continue
        except BaseException as e:  # surfaced in the learner's thread by step()
            self.error = e

    def step(self, step: int) -> dict[str, float]:
        cfg, learner_version = self.cfg, step - 1
        taken: list[Groups] = []
        discarded = 0
        while len(taken) < groups_per_batch(cfg):
            if self.error is not None:
                raise self.error
            try:
                group = self.ready.get(timeout=0.1)
            except queue.Empty:
                continue
            fresh, old = split_by_age([group], learner_version, cfg.max_steps_off_policy)
            taken += fresh
            for g in old:
                discarded += 1
                self.resample.extend(g.problems_P)
        batch = Groups.join(taken)
        metrics = train_on_groups(cfg, self.policy, self.optimizer, batch, cfg.num_substeps)
        with self.weights:  # the sampler's next groups come from the updated policy
            _copy_trainable(self.policy.model, self.sampler_policy.model)
            self.version = step
        return {
            **metrics,
            **staleness(batch, learner_version),
            metrics_names.ASYNC_DISCARDED: float(discarded),
        }

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


def _one(groups: Groups, i: int) -> Groups:
    g = len(groups.rollouts_N) // len(groups)
    return Groups(
        [groups.problems_P[i]],
        groups.rollouts_N[i * g : (i + 1) * g],
        groups.rewards_PG[i : i + 1],
        [groups.versions_P[i]],
        groups.sample_s / len(groups),
        groups.reward_timeouts if i == 0 else groups.reward_timeouts and 0,  # counted once
    )


@torch.no_grad()
def _copy_trainable(source: torch.nn.Module, target: torch.nn.Module) -> None:
    params = dict(target.named_parameters())
    for name, p in source.named_parameters():
        if p.requires_grad:
            params[name].copy_(p)


# One class for each name of pipeline_settings.PIPELINES (which validation reads without
# importing this module); tests/test_pipelines.py holds the two together.
PIPELINE_CLASSES = {"sync": SyncPipeline, "stream": StreamPipeline, "async": AsyncPipeline}


def make_pipeline(cfg, policy, sampler, task, optimizer, rng, settings) -> Pipeline:
    return PIPELINE_CLASSES[cfg.pipeline](cfg, policy, sampler, task, optimizer, rng, settings)
