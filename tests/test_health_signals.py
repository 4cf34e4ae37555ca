"""The signals the health rules read, computed right (issue 48): a step that trained on nothing
logs no entropy or loss; a completion ends on any of the model's end-of-sequence ids; TRL's
zero-advantage share is a share of groups whatever `scale_rewards` does."""

from __future__ import annotations

from collections import Counter

import torch
from conftest import PROMPTS

from records import metrics
from trainer.model.rollout import eos_ids
from trainer.rl.step import UPDATE_METRICS, average_updates
from trainer.run.health import default_rules, warnings
from trainer.sampling.model_source import load_policy
from trainer.sampling.protocol import SamplingSettings
from trainer.sampling.torch_sampler import TorchSampler


def test_a_step_that_trained_on_nothing_logs_no_entropy_or_loss():
    """All groups filtered (remove_constant_reward_groups): no update, so no value; an entropy
    of 0 on three such steps fired entropy_collapse."""
    assert set(average_updates([])) & set(UPDATE_METRICS) == set()
    one = {m: 1.0 for m in UPDATE_METRICS}
    assert average_updates([one, {**one, metrics.ENTROPY: 0.5}])[metrics.ENTROPY] == 0.75
    healthy = {metrics.ENTROPY: 1.0, metrics.REWARD: 0.5}
    nothing = {metrics.REWARD: 0.0, **average_updates([])}  # the metrics such a step logs
    run = {step: dict(healthy) for step in range(1, 4)} | {s: nothing for s in range(4, 8)}
    assert [b.rule for b in warnings(default_rules(0.01), run)] == []


def test_eos_ids_are_the_generation_configs_list_and_the_tokenizers():
    class Config:
        eos_token_id = [7, 2]

    class Model:
        generation_config = Config()

    class Tokenizer:
        eos_token_id = 3

    assert eos_ids(Model(), Tokenizer()) == {2, 3, 7}
    Config.eos_token_id = 3
    assert eos_ids(Model(), Tokenizer()) == {3}
    Config.eos_token_id = None
    assert eos_ids(object(), Tokenizer()) == {3}


def test_a_completion_ends_at_any_of_the_models_end_of_sequence_ids(composed):
    """A second EOS id in the generation config (as chat models list several) ends a
    completion there, finished, as TRL and vLLM stop."""
    policy = load_policy(composed())
    eos = policy.tokenizer.eos_token_id
    settings = SamplingSettings(max_tokens=6)
    torch.manual_seed(0)
    plain = TorchSampler(policy).sample(PROMPTS * 8, settings)
    # the token the model writes most often before its end: made a second EOS
    counts = Counter(t for r in plain for t in r.completion_ids if t != eos)
    other = counts.most_common(1)[0][0]
    policy.model.generation_config.eos_token_id = [eos, other]
    torch.manual_seed(0)
    rollouts = TorchSampler(policy).sample(PROMPTS * 8, settings)
    ends = {eos, other}
    for r in rollouts:
        assert not ends & set(r.completion_ids[:-1])  # nothing after the first end
        assert r.finished == (r.completion_ids[-1] in ends)
        assert r.finished or len(r.completion_ids) == settings.max_tokens
    assert any(r.completion_ids[-1] == other and r.finished for r in rollouts)
    truncated = sum(not r.finished for r in rollouts) / len(rollouts)
    assert truncated < sum(not r.finished for r in plain) / len(plain)
