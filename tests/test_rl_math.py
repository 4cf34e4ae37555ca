"""The GRPO math on hand-computed numbers."""

import pytest
import torch

from trainer.model import logprobs
from trainer.rl import rl_math

ALL_REWARDS = [0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0]


@pytest.mark.parametrize(
    ("group_size", "expected"),
    [  # the table in the RL hyperparameters tutorial (seeds/002)
        (2, [[0.0, 0.0], [0.5, -0.5], [0.0, 0.0], [-0.5, 0.5]]),
        (4, [[-0.25, -0.25, 0.75, -0.25], [0.25, 0.25, -0.75, 0.25]]),
        (8, [[-0.5, -0.5, 0.5, -0.5, 0.5, 0.5, -0.5, 0.5]]),
    ],
)
def test_advantages_are_centred_within_each_group(group_size, expected):
    rewards_PG = torch.tensor(ALL_REWARDS).view(-1, group_size)
    assert rl_math.compute_advantages(rewards_PG).tolist() == expected


def test_group_and_batch_scaling_divide_by_the_std():
    rewards_PG = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    group = rl_math.compute_advantages(rewards_PG, "group")
    # group 0: centred +-0.5, std (Bessel) 0.7071 -> +-0.7071; the constant group stays 0
    assert group[0].tolist() == pytest.approx([0.70710, -0.70710], abs=1e-4)
    assert group[1].tolist() == [0.0, 0.0]
    batch = rl_math.compute_advantages(rewards_PG, "batch")
    # batch std of [1, 0, 1, 1] = 0.5
    assert batch[0].tolist() == pytest.approx([1.0, -1.0], abs=1e-4)


def test_unknown_reward_scaling_is_rejected():
    with pytest.raises(ValueError, match="scale_rewards='std'"):
        rl_math.compute_advantages(torch.zeros(1, 2), "std")


def test_constant_groups_and_outcome_fractions():
    rewards_PG = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    assert rl_math.constant_groups(rewards_PG).tolist() == [True, False, True]
    fractions = rl_math.group_outcome_fractions(rewards_PG)
    assert fractions == pytest.approx(
        {
            "groups/frac_mixed": 1 / 3,
            "groups/frac_all_good": 1 / 3,
            "groups/frac_all_bad": 1 / 3,
            "groups/frac_zero_advantage": 2 / 3,  # all good + all bad: nothing to learn
        }
    )


SAMPLER = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]])
REFERENCE = torch.tensor([[-1.5, -2.0], [-0.5, -1.0]])
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])


def test_kl_penalty_pushes_tokens_toward_the_batch_mean_kl():
    # kl on action tokens: [[0.5, 0], [0, -]] -> mean 0.5 / 3
    shaping, mean_kl = rl_math.kl_penalty(SAMPLER, REFERENCE, MASK, coef=0.1)
    assert mean_kl == pytest.approx(1 / 6)
    expected = [[0.1 * (1 / 6 - 0.5), 0.1 * (1 / 6)], [0.1 * (1 / 6), 0.0]]
    assert shaping[0].tolist() == pytest.approx(expected[0])
    assert shaping[1].tolist() == pytest.approx(expected[1])
    assert (shaping * MASK).sum().item() == pytest.approx(0.0, abs=1e-7)  # zero-mean shaping


def test_kl_discount_adds_the_discounted_future_terms():
    shaping, _ = rl_math.kl_penalty(SAMPLER, REFERENCE, MASK, coef=0.1, discount=0.5)
    # row 0: t1 = 0.1/6; t0 = 0.1*(1/6 - 0.5) + 0.5 * 0.1/6 = -0.025
    assert shaping[0].tolist() == pytest.approx([-0.025, 0.1 / 6])
    assert shaping[1].tolist() == pytest.approx([0.1 / 6, 0.0])


def test_discounted_future_sum():
    x = torch.tensor([[1.0, 2.0, 4.0]])
    assert rl_math.discounted_future_sum(x, 0.5).tolist() == [[1.0 + 1.0 + 1.0, 2.0 + 2.0, 4.0]]
    assert rl_math.discounted_future_sum(x, 0.0).tolist() == x.tolist()


def test_both_sample_train_kl_estimators():
    sampler = torch.tensor([[-1.0, -2.0, -9.0]])
    learner = torch.tensor([[-1.5, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is padding
    v1, v2 = rl_math.kl_sample_train(sampler, learner, mask)
    assert v1 == pytest.approx((0.5 - 1.0) / 2)  # mean(d), d = [0.5, -1.0]
    assert v2 == pytest.approx(0.5 * (0.25 + 1.0) / 2)  # 0.5 * mean(d^2)
    assert rl_math.kl_sample_train(sampler, sampler, mask) == (0.0, 0.0)


def test_token_entropy_of_uniform_and_peaked_distributions():
    uniform = torch.zeros(1, 1, 4)
    assert logprobs.token_entropy(uniform).item() == pytest.approx(
        torch.log(torch.tensor(4.0)).item()
    )
    peaked = torch.tensor([[[100.0, 0.0, 0.0, 0.0]]])
    assert logprobs.token_entropy(peaked).item() == pytest.approx(0.0, abs=1e-6)


def test_minibatches_keep_every_rollout_of_a_problem_together():
    rows = rl_math.minibatch_rows(num_groups=4, group_size=2, num_substeps=2)
    assert [r.tolist() for r in rows] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [r.tolist() for r in rl_math.minibatch_rows(4, 2, 1)] == [[0, 1, 2, 3, 4, 5, 6, 7]]


def test_minibatches_drop_filtered_groups_and_empty_minibatches():
    keep_P = torch.tensor([False, True, False, False])
    rows = rl_math.minibatch_rows(num_groups=4, group_size=3, num_substeps=2, keep_P=keep_P)
    assert [r.tolist() for r in rows] == [[3, 4, 5]]  # problem 1 only; the 2nd chunk is empty


def test_lr_auto_follows_the_seeds_formula():
    from trainer.run.lr import get_lr

    # 5e-5 x 10 (LoRA) x (2000 / 2000) ** 0.781
    assert get_lr(2000, "llama") == pytest.approx(5e-4)
    # full fine-tuning at hidden 1000: 5e-5 x 2 ** 0.781 = 5e-5 x 1.71835
    assert get_lr(1000, "llama", lora=False) == pytest.approx(8.5918e-5, rel=1e-4)
    # SmolLM2-135M (hidden 576): 5e-4 x (2000 / 576) ** 0.781 = 5e-4 x 2.6437
    assert get_lr(576, "llama") == pytest.approx(1.3219e-3, rel=1e-4)
    # qwen's exponent 0.0775: 5e-4 x 2 ** 0.0775 = 5e-4 x 1.05516
    assert get_lr(1000, "qwen") == pytest.approx(5.2758e-4, rel=1e-4)
    with pytest.raises(ValueError, match="model.family='gpt'"):
        get_lr(1000, "gpt")
