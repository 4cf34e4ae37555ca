"""The signals the health rules read, computed right (issue 48): a step that trained on nothing
logs no entropy or loss; a completion ends on any of the model's end-of-sequence ids; TRL's
zero-advantage share is a share of groups whatever `scale_rewards` does."""

from __future__ import annotations

from collections import Counter

import pytest
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


# --- TRL: the groups' shares from its rewards, not its frac_reward_zero_std flag -------------

# Two reward functions, weights 1 and 0.5, group_size 4, three problems. Totals per rollout:
# problem 0: 1.5 1.5 1.5 1.5 (all rewarded alike), problem 1: 0 0 0 0 (none), problem 2:
# 1.5 0.5 1.5 1.5 (mixed). Zero-advantage share 2/3, mixed 1/3. TRL's flag with
# scale_rewards=batch is isclose(batch std, 0) for every rollout: 0.0, whatever the groups.
CORRECT = [1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 1, 1]
FORMAT = [1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]


def test_trl_group_shares_are_shares_of_groups_from_its_rewards():
    from trainer.backends.trl.callback import group_rewards
    from trainer.rl import rl_math

    by_func = {"correct": CORRECT, "format": FORMAT}
    rewards_PG = group_rewards(by_func, ["correct", "format"], [1.0, 0.5], 4)
    assert rewards_PG.tolist() == [[1.5] * 4, [0.0] * 4, [1.5, 0.5, 1.5, 1.5]]
    shares = rl_math.group_outcome_fractions(rewards_PG)
    assert shares[metrics.GROUPS_ZERO_ADVANTAGE] == pytest.approx(2 / 3)
    assert shares[metrics.GROUPS_MIXED] == pytest.approx(1 / 3)
    # a function that returned None (NaN) for a rollout adds nothing, as TRL's nansum
    with_none = {"correct": CORRECT, "format": [*FORMAT[:8], float("nan"), 1, 1, 1]}
    assert group_rewards(with_none, ["correct", "format"], [1.0, 0.5], 4)[2, 0] == 1.0
    assert group_rewards({}, ["correct"], [1.0], 4) is None  # nothing generated yet


def test_trl_steps_report_the_groups_shares_whatever_trl_flagged():
    """The callback's step: TRL's batch-level frac_reward_zero_std (0.0 with
    scale_rewards=batch) does not reach the health rules; the groups' shares do."""
    from types import SimpleNamespace

    from trainer.backends.trl.callback import Reporting, group_rewards

    cfg = SimpleNamespace(
        num_substeps=1, compute_post_kl=False, max_steps=10, eval_every=0, kl_threshold=0.01
    )

    class Seen:
        def report(self, step, metrics_):
            self.metrics = metrics_

    seen = Seen()
    rewards = lambda: group_rewards({"c": CORRECT, "f": FORMAT}, ["c", "f"], [1.0, 0.5], 4)  # noqa: E731
    reporting = Reporting(cfg, seen, None, lambda post: {}, False, None, rewards)
    control = SimpleNamespace(should_training_stop=False, should_save=True)
    logs = {"reward": 0.7, "frac_reward_zero_std": 0.0, "entropy": 0.9}
    reporting.on_log(None, SimpleNamespace(global_step=1), control, logs=logs)
    assert seen.metrics[metrics.GROUPS_ZERO_ADVANTAGE] == pytest.approx(2 / 3)
    assert seen.metrics[metrics.GROUPS_MIXED] == pytest.approx(1 / 3)
    assert seen.metrics["trl/frac_reward_zero_std"] == 0.0


# --- entropy_collapse's bound on the recorded real-model curves (calibration files) ---------


def test_the_entropy_bound_fires_on_the_recorded_collapses_and_not_on_the_learners():
    """SmolLM2 (bench/results/health_curves_smollm2_seed*.json, 12 steps): lr=1e-2 and 3e-3
    collapse (entropy 0.97 -> 0.02, 0.06), lr=3e-4 (both seeds, lowest 0.11 and 0.19 of its
    first) and lr=1e-3 (0.20) learn. The bound 0.1 x the first step's is kept as it was."""
    import json
    from pathlib import Path

    from trainer.run.health import failure_mode_rules

    results = Path(__file__).resolve().parents[1] / "bench" / "results"
    runs = {}
    for seed in (0, 1):
        recorded = json.loads((results / f"health_curves_smollm2_seed{seed}.json").read_text())
        for name, run in recorded.items():
            if name != "machine":
                curve = run.get("curve", run)
                runs[f"seed{seed} {name}"] = {int(s): m for s, m in curve.items()}
    (rule,) = [r for r in failure_mode_rules() if r.name == "entropy_collapse"]
    fired = {name: [b.step for b in warnings([rule], curve)] for name, curve in runs.items()}
    assert fired == {
        "seed0 lr=0.0003 num_substeps=1": [],
        "seed0 lr=0.001 num_substeps=1": [],
        "seed0 lr=0.003 num_substeps=1": [11],
        "seed0 lr=0.01 num_substeps=1": [6],
        "seed1 lr=0.0003 num_substeps=1 seed=1": [],
    }


def test_trls_callback_saves_the_monitor_beside_the_checkpoint_and_restores_it(tmp_path):
    """on_save writes health.json into TRL's checkpoint-<n>/ (after that step's report);
    restore() gives a resumed run the same monitor."""
    import json
    from types import SimpleNamespace

    from trainer.backends.trl.callback import Reporting
    from trainer.backends.trl.checkpoints import HEALTH

    cfg = SimpleNamespace(
        num_substeps=1, compute_post_kl=False, max_steps=10, eval_every=0, kl_threshold=0.01
    )
    control = SimpleNamespace(should_training_stop=False, should_save=True)
    first = Reporting(cfg, None, None, lambda post: {}, False)
    first.report(0, {metrics.EVAL_REWARD: 0.3}, control)
    for step, kl in ((1, 0.5), (2, 2.4)):
        first.report(step, {metrics.KL_PRE_POST_V2: kl, metrics.ENTROPY: 1.0}, control)
    (tmp_path / "checkpoint-2").mkdir()
    args, state = SimpleNamespace(output_dir=str(tmp_path)), SimpleNamespace(global_step=2)
    state.is_world_process_zero = True
    first.on_save(args, state, control)
    saved = json.loads((tmp_path / "checkpoint-2" / HEALTH).read_text())
    assert saved["streaks"]["post_update_kl"] == 2
    assert saved["baselines"][metrics.EVAL_REWARD] == 0.3
    resumed = Reporting(cfg, None, None, lambda post: {}, True)
    resumed.restore(tmp_path / "checkpoint-2")
    assert resumed.health.monitor.state() == first.health.monitor.state()
    # the next KL breach (far above the bound, the second such in a row: no held-out eval
    # yet) is the rule's third in a row, as in the run never stopped
    fired = resumed.health.monitor.breaches(3, {metrics.KL_PRE_POST_V2: 2.5})
    assert [b.rule for b in fired] == ["post_update_kl"]


def test_length_blowup_can_fire_under_a_short_max_tokens_and_spares_a_learner():
    """The tiny model starts at 3.5 of max_tokens=8 tokens: a hacked run padding to the cap
    (3.5 -> 6, 7, 8: 1.7-2.3 x) passes 1.5 x from step 2, three steps in a row at step 4; the
    old bound, 3 x = 10.5 tokens, lies past the cap. A learner's 1.2 x (4.2) never fires."""
    from trainer.run.health import failure_mode_rules

    (rule,) = [r for r in failure_mode_rules() if r.name == "length_blowup"]
    padded = {s: {metrics.COMPLETION_LENGTH: v} for s, v in enumerate([3.5, 6, 7, 8, 8], 1)}
    assert [b.step for b in warnings([rule], padded)] == [4]
    learner = {s: {metrics.COMPLETION_LENGTH: v} for s, v in enumerate([3.5, 4.2, 4.2, 4.2], 1)}
    assert warnings([rule], learner) == []
