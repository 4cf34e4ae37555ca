"""Packed trials (trainer/packed/) against the same trials trained alone, on the tiny model.

The reference is a solo run with `sampler.merge_lora=false`: PEFT's own forward,
x W^T + s (x A^T) B^T, the arithmetic the pack's grouped layers do. Against it a packed
member's per-step loss, KLs, rewards, entropy, gradient norm and final adapter are equal to
float64 rounding: the tests train in `model.dtype=float64`.

Why not float32: on the tiny model half the entries of layer 1's q/k LoRA B get gradients
at rounding level (their heads' attention is saturated), and AdamW's first step turns that
noise into moves of about lr with the noise's sign. The pack's batched products and PEFT's
round differently on some CPUs: bit for bit equal on an Intel Xeon, about 500 of 1024 such
entries apart on an AMD EPYC. In float64 the same noise moves them by about 1e-9 lr.

The solo default (merge_lora=true, float32) adds the adapter into the weight instead, so
its log-probs differ in the last float32 bits; the last tests pin the pack's float32 numbers
to it up to the first optimizer step, before AdamW can amplify that rounding.
"""

from __future__ import annotations

import functools

import pytest
import torch
from safetensors.torch import load_file

from trainer.model.token_batch import TokenBatch
from trainer.packed.batches import learner_round
from trainer.packed.host import train_packed
from trainer.run.train import train

SHAPE = ["batch_size=4", "group_size=4", "task.eval_size=16", "eval_every=2", "max_steps=3"]
EXACT = [*SHAPE, "model.dtype=float64"]  # the module docstring says why
# Members differ in what a sweep varies: lr, seed, KL penalty, loss, substeps.
MEMBERS = [
    ["seed=0", "lr=2e-3"],
    ["seed=1", "lr=5e-3", "kl_penalty_coef=0.05"],
    ["seed=2", "lr=1e-3", "loss=ppo", "num_substeps=2"],
    ["seed=3", "lr=3e-3", "loss=dr_grpo", "scale_rewards=group"],
]
COMPARED = (
    "loss",
    "grad_norm",
    "entropy",
    "kl_sample_train_v1",
    "kl_sample_train_v2",
    "kl_pre_post_v1",
    "kl_pre_post_v2",
    "kl_policy_ref",
    "reward/mean",
    "reward/std",
    "eval/reward/mean",
    "eval/greedy/mean",
)
AFTER_THE_UPDATE = {"kl_pre_post_v1", "kl_pre_post_v2", "eval/reward/mean", "eval/greedy/mean"}
FLOAT64 = {"rtol": 1e-7, "atol": 1e-7}  # torch.testing's float64 defaults


def metrics(recorder) -> dict[int, dict[str, float]]:
    return {s: {k: m[k] for k in COMPARED if k in m} for s, m in recorder.steps.items()}


def adapter(output_dir) -> dict[str, torch.Tensor]:
    return load_file(f"{output_dir}/adapter/adapter_model.safetensors")


def labelled(label: str):
    """assert_close's message with the mismatch's figures kept, led by what mismatched."""
    return lambda message: f"{label}: {message}"


def assert_same_run(solo, packed, solo_dir, packed_dir) -> None:
    a, b = metrics(solo), metrics(packed)
    assert a.keys() == b.keys()
    for step in a:
        assert a[step].keys() == b[step].keys()
        for name, value in a[step].items():
            expected = torch.tensor(value, dtype=torch.float64)
            actual = torch.tensor(b[step][name], dtype=torch.float64)
            torch.testing.assert_close(
                actual, expected, **FLOAT64, msg=labelled(f"{name} at {step}")
            )
    weights, packed_weights = adapter(solo_dir), adapter(packed_dir)
    assert weights.keys() == packed_weights.keys()
    for name, tensor in weights.items():
        torch.testing.assert_close(packed_weights[name], tensor, **FLOAT64, msg=labelled(name))


@pytest.fixture(scope="module")
def solo_runs(tmp_path_factory):
    """Each member trained alone (PEFT's unmerged forward), once for the module's tests."""
    from conftest import Recorder, compose_conf

    runs = []
    for i, member in enumerate(MEMBERS):
        out = tmp_path_factory.mktemp(f"solo{i}")
        recorder = Recorder()
        train(
            compose_conf(f"output_dir={out}", *EXACT, *member, "sampler.merge_lora=false"), recorder
        )
        runs.append((recorder, out))
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2, 4])
def test_a_packed_member_trains_as_it_would_alone(k, solo_runs, tmp_path, composed, new_recorder):
    cfgs = [composed(*EXACT, *m, root=tmp_path / f"m{i}") for i, m in enumerate(MEMBERS[:k])]
    recorders = [new_recorder() for _ in cfgs]
    results = train_packed(cfgs, recorders)
    assert not [r for r in results if isinstance(r, BaseException)], results
    for i, (recorder, cfg) in enumerate(zip(recorders, cfgs, strict=True)):
        solo, solo_dir = solo_runs[i]
        assert_same_run(solo, recorder, solo_dir, cfg.output_dir)


class PruneAt:
    """A reporter that stops its trial at a step, as a sweep prunes one."""

    def __init__(self, recorder, step: int) -> None:
        self.recorder, self.step = recorder, step

    def report(self, step, metrics) -> None:
        self.recorder.report(step, metrics)
        if step == self.step:
            raise RuntimeError("pruned")


@pytest.mark.slow
def test_a_member_pruned_mid_pack_leaves_the_others_unchanged(
    solo_runs, tmp_path, composed, new_recorder
):
    cfgs = [composed(*EXACT, *m, root=tmp_path / f"m{i}") for i, m in enumerate(MEMBERS[:3])]
    recorders = [new_recorder() for _ in cfgs]
    reporters = [recorders[0], PruneAt(recorders[1], 1), recorders[2]]
    results = train_packed(cfgs, reporters)
    assert isinstance(results[1], RuntimeError) and str(results[1]) == "pruned"
    assert max(recorders[1].steps) == 1
    for i in (0, 2):
        solo, solo_dir = solo_runs[i]
        assert_same_run(solo, recorders[i], solo_dir, cfgs[i].output_dir)


@pytest.mark.slow
def test_a_member_that_joins_mid_pack_trains_as_alone_and_leaves_the_others_unchanged(
    solo_runs, tmp_path, composed, new_recorder
):
    """A member pruned at step 1 gives its slot to a new one (a sweep's queued trial): the
    newcomer's numbers are its solo run's, and so are those of the member it joined."""
    from trainer.packed.host import PackHost
    from trainer.packed.members import current_source

    cfgs = [composed(*EXACT, *m, root=tmp_path / f"m{i}") for i, m in enumerate(MEMBERS[:3])]
    recorders = [new_recorder() for _ in cfgs]
    reporters = [recorders[0], PruneAt(recorders[1], 1), recorders[2]]
    bodies = [  # what train_packed runs: a train() that finds the member its thread runs
        functools.partial(lambda c, r: train(c, r, current_source()), c, r)
        for c, r in zip(cfgs, reporters, strict=True)
    ]
    joined = []  # (the member that ended, the first member's last step by then)

    def more(member, result):
        if member != 1:
            return None
        joined.append((member, max(recorders[0].steps)))
        return bodies[2]

    results = PackHost(cfgs).run_bodies(bodies[:2], more)
    assert isinstance(results[1], RuntimeError) and str(results[1]) == "pruned", results
    assert not [r for i, r in enumerate(results) if i != 1 and isinstance(r, BaseException)]
    assert len(results) == 3 and [m for m, _ in joined] == [1]
    assert joined[0][1] < 3  # it joined while member 0 trained on (max_steps=3)
    for i in (0, 2):
        solo, solo_dir = solo_runs[i]
        assert_same_run(solo, recorders[i], solo_dir, cfgs[i].output_dir)


@pytest.mark.slow
def test_the_first_step_equals_the_default_solo_run_to_float32_rounding(
    tmp_path, composed, new_recorder
):
    """Against merge_lora=true (the solo default), in float32, up to the first optimizer step:
    the baseline eval and step 1's rewards, loss, KLs to the sampler and gradient norm. What
    step 1 measures after its update (kl_pre_post, its eval) carries AdamW's amplified
    rounding (the module docstring), so it is left out."""
    shape = [*SHAPE, "max_steps=1"]
    cfgs = [composed(*shape, *m, root=tmp_path / f"m{i}") for i, m in enumerate(MEMBERS[:2])]
    recorders = [new_recorder() for _ in cfgs]
    train_packed(cfgs, recorders)
    for i, member in enumerate(MEMBERS[:2]):
        solo = new_recorder()
        train(composed(*shape, *member, root=tmp_path / f"solo{i}"), solo)
        a, b = metrics(solo), metrics(recorders[i])
        for step in a:
            for name, value in a[step].items():
                if step == 0 or name not in AFTER_THE_UPDATE:
                    assert b[step][name] == pytest.approx(value, rel=1e-4, abs=1e-5), (name, step)


@pytest.mark.slow
def test_learner_pieces_share_one_budget_and_each_member_trains_as_alone(
    tmp_path, composed, new_recorder, monkeypatch
):
    """With a learner budget that splits a minibatch, the members cut their pieces as their
    solo runs do, and the pack runs together only pieces that fit one budget (so its forward
    holds a solo run's activations): each member's numbers are still its solo run's."""
    from trainer.model.micro_batches import piece_tokens
    from trainer.packed import host

    budget = ["learner_batch_tokens=80", "sampler.merge_lora=false"]
    rounds: list[list[int]] = []  # each learner forward: its pieces' tokens
    learner = host.HANDLERS["learner"]

    def counted(self, key, group, payloads):
        widths = [(b, r, b.completion_ids_NT.shape[1]) for b, r, _ in payloads]
        rounds.append(
            [piece_tokens(r, b.prompt_of_N, b.prompt_mask_DS.sum(-1), w) for b, r, w in widths]
        )
        return learner(self, key, group, payloads)

    monkeypatch.setitem(host.HANDLERS, "learner", counted)
    cfgs = [
        composed(*EXACT, *budget, *m, root=tmp_path / f"m{i}") for i, m in enumerate(MEMBERS[:2])
    ]
    recorders = [new_recorder() for _ in cfgs]
    results = train_packed(cfgs, recorders)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert max(sum(r) for r in rounds) <= 80 < sum(map(sum, rounds)), rounds  # split, bounded
    for i, member in enumerate(MEMBERS[:2]):
        solo, cfg = new_recorder(), composed(*EXACT, *budget, *member, root=tmp_path / f"s{i}")
        train(cfg, solo)
        assert_same_run(solo, recorders[i], cfg.output_dir, cfgs[i].output_dir)


def test_a_learner_round_takes_pieces_in_member_order_while_they_fit_the_least_budget():
    """Hand-made pieces: 2 prompts of 3 and 5 tokens; a piece's tokens are its distinct
    prompts' tokens once plus the completion width (4) per rollout."""
    batch = TokenBatch(
        torch.zeros(2, 5, dtype=torch.long),
        torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]),
        torch.tensor([0, 0, 1, 1]),
        torch.zeros(4, 4, dtype=torch.long),
        torch.ones(4, 4),
        torch.zeros(4, 4),
        torch.ones(4, dtype=torch.bool),
    )
    first_prompt = (batch, torch.tensor([0, 1]), 40)  # 3 + 2 x 4 = 11 tokens
    both_prompts = (batch, torch.tensor([1, 2]), None)  # 3 + 5 + 2 x 4 = 16 tokens
    assert learner_round([first_prompt, both_prompts, first_prompt]) == 3  # 38 <= 40
    assert learner_round([first_prompt, both_prompts, both_prompts]) == 2  # 43 > 40
    assert learner_round([(batch, torch.tensor([1, 2]), 10), first_prompt]) == 1  # the first runs
    assert learner_round([both_prompts, both_prompts]) == 2  # no budget: no limit
