"""Each loss's aggregation on hand-computed numbers, and the clipping."""

import math

import pytest
import torch

from trainer.base.config import LossConfig
from trainer.rl.losses import LOSSES, LossInputs, get_loss

SAMPLER = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
ADVANTAGES = torch.tensor([[1.0, 1.0, 1.0], [2.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])  # a 3-token and a 1-token completion


def on_policy_inputs(max_tokens: int = 4) -> LossInputs:
    return LossInputs(SAMPLER.clone(), SAMPLER, ADVANTAGES, MASK, max_tokens)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("importance_sampling", -(3 + 2) / 2),  # token sum per sequence, mean over sequences
        ("ppo", -(3 + 2) / 2),
        ("grpo", -(1 + 2) / 2),  # token mean per sequence, then mean
        ("bnpo", -5 / 4),  # mean over the 4 action tokens
        ("dr_grpo", -5 / (2 * 4)),  # token sum / (sequences x max_tokens)
        ("dapo", -5 / 4),  # token-level mean
    ],
)
def test_aggregation_at_ratio_one(name, expected):
    loss = get_loss(name)(on_policy_inputs(), LossConfig(name=name))
    assert loss.item() == pytest.approx(expected)


def test_every_registered_loss_has_a_config_file_and_a_checked_name():
    from pathlib import Path

    from omegaconf import OmegaConf

    from trainer.base.config import LOSS_NAMES

    conf = Path(__file__).parents[1] / "conf" / "loss"
    presets = {p.stem: OmegaConf.load(p).name for p in conf.glob("*.yaml")}
    assert set(LOSSES) == set(LOSS_NAMES) == set(presets.values())
    assert set(LOSS_NAMES) <= set(presets)  # each loss by its own name (trl_default is dapo)


def ratio_inputs(ratio: float, advantage: float) -> LossInputs:
    old = torch.tensor([[-1.0]])
    return LossInputs(old + math.log(ratio), old, torch.tensor([[advantage]]), torch.ones(1, 1), 1)


@pytest.mark.parametrize(
    ("ratio", "advantage", "ppo", "dapo", "importance_sampling"),
    [
        (2.0, 1.0, -1.2, -1.28, -2.0),  # positive advantage: the ratio is capped at clip_high
        (2.0, -1.0, 2.0, 2.0, 2.0),  # negative advantage: min() keeps the unclipped, worse term
        (0.5, 1.0, -0.5, -0.5, -0.5),
        (0.5, -1.0, 0.8, 0.8, 0.5),  # negative advantage: floored at clip_low
    ],
)
def test_clipping(ratio, advantage, ppo, dapo, importance_sampling):
    x = ratio_inputs(ratio, advantage)
    assert LOSSES["ppo"](x, LossConfig(clip_low=0.8, clip_high=1.2)).item() == pytest.approx(ppo)
    assert LOSSES["dapo"](x, LossConfig(clip_low=0.8, clip_high=1.28)).item() == pytest.approx(dapo)
    assert LOSSES["importance_sampling"](x, LossConfig()).item() == pytest.approx(
        importance_sampling
    )


def test_gradient_of_importance_sampling_is_the_policy_gradient():
    logp = SAMPLER.clone().requires_grad_(True)
    loss = LOSSES["importance_sampling"](
        LossInputs(logp, SAMPLER, ADVANTAGES, MASK, 4), LossConfig()
    )
    loss.backward()
    # d/dlogp of -ratio*A at ratio 1 is -A / num_sequences on action tokens, 0 elsewhere
    assert torch.allclose(logp.grad, -ADVANTAGES * MASK / 2)


def test_unknown_loss_names_the_choices():
    with pytest.raises(KeyError, match="loss.name='reinforce'"):
        get_loss("reinforce")
