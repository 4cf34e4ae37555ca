"""Pipelines over one shared step: the split step trains a batch exactly as before, streaming
accumulates to the same update, async discards groups by age and logs their staleness, and
bad pipeline settings fail in one line."""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch
from conftest import run_sweep, study_in

from records import metrics
from trainer.env.tasks import AdditionTask
from trainer.model.policy import Policy
from trainer.rl.pipeline_settings import PIPELINES
from trainer.rl.pipelines import PIPELINE_CLASSES, split_by_age, staleness
from trainer.rl.step import (
    Groups,
    backward,
    optimizer_step,
    prepare,
    sample_groups,
    train_on_groups,
)
from trainer.run.train import train
from trainer.run.validation import ConfigError, validate
from trainer.sampling.factory import make_sampler
from trainer.sampling.model_source import load_policy
from trainer.sampling.protocol import SamplingSettings


def groups_of(versions: list[int]) -> list[Groups]:
    return [Groups([None], [], torch.zeros(1, 2), [v], 0.0) for v in versions]


def test_groups_older_than_k_updates_are_discarded():
    # the learner has made 5 updates; K=2 keeps groups sampled at versions 3, 4 and 5
    fresh, old = split_by_age(groups_of([5, 3, 2, 4, 0]), learner_version=5, max_steps_off_policy=2)
    assert [g.versions_P[0] for g in fresh] == [5, 3, 4]
    assert [g.versions_P[0] for g in old] == [2, 0]
    # ages 0, 2, 1 -> mean 1, max 2
    joined = Groups.join(fresh)
    assert staleness(joined, 5) == {"async/stale_mean": 1.0, "async/stale_max": 2.0}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["pipeline=batched"], "pipeline='batched': must be one of ('sync', 'stream', 'async')"),
        (["pipeline=stream", "num_minibatches=5"], "num_minibatches=5: groups_per_batch=32 must be divisible by num_substeps x num_minibatches = 5"),
        (["pipeline=stream", "groups_per_batch=12", "num_substeps=2", "num_minibatches=4"], "num_minibatches=4: groups_per_batch=12 must be divisible by num_substeps x num_minibatches = 8"),
        (["pipeline=async", "num_substeps=3", "batch_size=30", "groups_per_batch=8"], "num_substeps=3: groups_per_batch=8 must be divisible by num_substeps"),
        (["pipeline=async", "max_steps_off_policy=-1"], "max_steps_off_policy=-1: must be >= 0"),
        (["pipeline=stream", "scale_rewards=batch"], "scale_rewards='batch': batch needs the whole batch"),
    ],
)  # fmt: skip
def test_bad_pipeline_settings_fail_in_one_line(composed, overrides, message):
    with pytest.raises(ConfigError) as error:
        validate(composed(*overrides))
    assert str(error.value).startswith(message)


def _setup(composed, *overrides):
    cfg = composed("batch_size=4", "group_size=4", "loss=grpo", *overrides)
    torch.manual_seed(0)
    policy = load_policy(cfg)
    task = AdditionTask(eval_size=16)
    sampler = make_sampler("torch", policy, cfg)
    problems = task.train_problems(4, random.Random(0))
    groups = sample_groups(cfg, sampler, task, problems, SamplingSettings.from_config(cfg), 0)
    # SGD: the update is the gradient itself, so equal gradients give equal weights
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=0.1)
    return cfg, policy, groups, optimizer


def _weights(policy) -> list[torch.Tensor]:
    return [p.detach().clone() for p in policy.trainable_parameters()]


@pytest.mark.slow
def test_the_shared_step_equals_its_parts_and_streaming_accumulates_to_the_same_update(composed):
    cfg, policy, groups, optimizer = _setup(composed)
    start = copy.deepcopy(policy.model.state_dict())
    # 1. train_on_groups: one minibatch, one optimizer step
    train_on_groups(cfg, policy, optimizer, groups, num_substeps=1)
    whole = _weights(policy)
    # 2. the same groups as two streamed minibatches of 2 groups, each loss halved, one step
    policy.model.load_state_dict(start)
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=0.1)
    updates = []
    for half in (Groups.join([_slice(groups, 0, 2)]), Groups.join([_slice(groups, 2, 4)])):
        prepared = prepare(cfg, policy, half)
        updates.append(backward(cfg, policy, prepared, torch.arange(8), scale=0.5))
    optimizer_step(cfg, policy, optimizer, *updates)
    streamed = _weights(policy)
    for a, b in zip(whole, streamed, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)
    assert any(not torch.equal(a, b) for a, b in zip(whole, _initial(start, policy), strict=True))


def _slice(groups: Groups, a: int, b: int) -> Groups:
    g = len(groups.rollouts_N) // len(groups)
    return Groups(
        groups.problems_P[a:b],
        groups.rollouts_N[a * g : b * g],
        groups.rewards_PG[a:b],
        groups.versions_P[a:b],
        0.0,
    )


def _initial(state: dict, policy) -> list[torch.Tensor]:
    names = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    return [state[n] for n in names]


@pytest.mark.slow
def test_stream_is_on_policy_and_async_logs_staleness(composed, new_recorder):
    small = ["batch_size=8", "group_size=4", "task.eval_size=16", "eval_every=0", "max_steps=4"]
    stream = new_recorder()
    train(composed(*small, "pipeline=stream", "num_minibatches=2", "num_substeps=2"), stream)
    assert max(stream.series("kl_sample_train_v2").values()) < 1e-6  # every substep on-policy
    assert all(metrics.TIME_POST_KL in m for m in list(stream.steps.values())[1:])
    off = new_recorder()
    train(composed(*small, "pipeline=async", "max_steps_off_policy=2"), off)
    steps = [off.steps[s] for s in (1, 2, 3, 4)]
    assert all(0 <= m["async/stale_mean"] <= m["async/stale_max"] <= 2 for m in steps)
    assert all(m["async/discarded"] >= 0 and math.isfinite(m["kl_sample_train_v2"]) for m in steps)
    # The sampler thread keeps sampling with the old weights while step 1 trains, so a later
    # step trains on groups an update old: a pipeline that waited for fresh groups (sync) fails.
    assert steps[0]["async/stale_max"] == 0  # nothing older than the first policy exists
    assert max(m["async/stale_max"] for m in steps[1:]) >= 1


@pytest.mark.slow
def test_streaming_with_a_kl_penalty_runs_the_reference_once_per_minibatch(
    composed, new_recorder, monkeypatch
):
    """Its post-update KL reuses the step's tokens: no second, whole-batch reference forward."""
    forwards = []
    counted = Policy.logprobs

    def counting(policy, batch, temperature, role):
        forwards.append((role, len(batch.prompt_of_N)))
        return counted(policy, batch, temperature, role)

    monkeypatch.setattr(Policy, "logprobs", counting)
    small = ["batch_size=8", "group_size=4", "task.eval_size=16", "eval_every=0", "max_steps=1"]
    recorder = new_recorder()
    cfg = composed(*small, "pipeline=stream", "num_minibatches=2", "kl_penalty_coef=0.1")
    train(cfg, recorder)
    # 8 groups x 4 in 2 minibatches: the reference's forward on each (16 rollouts), then the
    # post-update KL's on the step's 32; before, a second reference forward on all 32 too.
    assert forwards == [("reference", 16), ("reference", 16), ("inference", 32)]
    trained = recorder.steps[1]
    # logged again (stream dropped them): at step 1 the policy is still the reference
    assert abs(trained[metrics.KL_POLICY_REF]) < 1e-6 and trained[metrics.TIME_REFERENCE] > 0


@pytest.mark.slow
def test_a_sweep_compares_the_pipelines(tmp_path):
    done = run_sweep(
        tmp_path, "pipeline=sync,stream,async", "max_steps=3", "batch_size=8", "task.eval_size=16"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    trials = {t.params["pipeline"]: t for t in study_in(tmp_path).trials}
    assert set(trials) == {"sync", "stream", "async"}
    assert all(t.state.name in ("COMPLETE", "PRUNED") for t in trials.values())


def test_every_pipeline_name_validation_accepts_has_a_class_and_no_other():
    assert list(PIPELINE_CLASSES) == list(PIPELINES)
