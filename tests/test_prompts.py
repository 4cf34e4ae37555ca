"""Prompts rendered once: the tiny model's plain tokens as before, and on SmolLM2 the chat
template's tokens, exactly one BOS, the same in the sampler, the learner and the eval."""

import json
import random

import pytest
from transformers import AutoTokenizer

from records import metrics
from trainer.base.errors import ConfigError
from trainer.env.prompts import PromptRenderer, baseline_advice
from trainer.env.tasks import make_task
from trainer.rl.step import prepare, sample_groups
from trainer.run.train import train
from trainer.sampling.factory import make_sampler
from trainer.sampling.model_source import load_policy
from trainer.sampling.protocol import SamplingSettings
from trainer.sampling.tiny_model import build_tiny_model

MESSAGES = [
    {"role": "system", "content": "Answer with the number only."},
    {"role": "user", "content": "What is 4 + 5?"},
]


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    from conftest import compose_conf

    return AutoTokenizer.from_pretrained(build_tiny_model(compose_conf().model.tiny))


def test_the_tiny_model_keeps_its_plain_tokens(tiny_tokenizer):
    renderer = PromptRenderer(tiny_tokenizer)  # auto: the tiny tokenizer has no template
    assert renderer.template_state() == "none"
    assert renderer("07+45=") == tiny_tokenizer("07+45=").input_ids
    joined = PromptRenderer(tiny_tokenizer, system_prompt="1+1=")
    assert joined("3+4=") == tiny_tokenizer("1+1=\n\n3+4=").input_ids
    with pytest.raises(ConfigError, match="task.chat_template=True: this tokenizer has no chat"):
        PromptRenderer(tiny_tokenizer, chat_template=True)


def test_a_batch_of_prompts_renders_as_each_prompt_alone(tiny_tokenizer):
    renderer = PromptRenderer(tiny_tokenizer)
    assert renderer("07+45=") == tiny_tokenizer("07+45=").input_ids  # cached before the batch
    prompts = ["07+45=", "1+2=", "07+45=", "93+8=", "1+2="]
    assert renderer.render_all(prompts) == [tiny_tokenizer(p).input_ids for p in prompts]
    assert len(renderer._ids) == 3  # one entry a distinct prompt
    joined = PromptRenderer(tiny_tokenizer, system_prompt="1+1=")  # not plain text: one by one
    assert joined.render_all(["3+4=", "5+6="]) == [joined("3+4="), joined("5+6=")]


@pytest.mark.real_model
def test_chat_template_applied_once_with_one_bos(smollm2):
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    expected = tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, return_dict=False
    )
    renderer = PromptRenderer(tokenizer)
    assert renderer.template_state() == "applied"
    assert renderer(MESSAGES) == expected
    assert expected[0] == tokenizer.bos_token_id and expected[1] != tokenizer.bos_token_id
    # A string prompt is the user's message; task.system_prompt goes first.
    assert (
        PromptRenderer(tokenizer, system_prompt=MESSAGES[0]["content"])(MESSAGES[1]["content"])
        == expected
    )
    # Already rendered text is tokenized as it is, without a second BOS.
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert renderer(text) == expected
    off = PromptRenderer(tokenizer, chat_template=False)
    assert off.template_state() == "off"
    assert off("What is 4 + 5?") == tokenizer("What is 4 + 5?").input_ids


@pytest.mark.real_model
def test_the_sampler_the_learner_and_the_eval_see_the_same_templated_tokens(
    smollm2, composed, tmp_path
):
    data = tmp_path / "chat.jsonl"
    data.write_text(
        json.dumps({"prompt": MESSAGES, "answer": "9"}) + "\n"
        + json.dumps({"prompt": "What is 2 + 2?", "answer": "4"}) + "\n"
    )  # fmt: skip
    cfg = composed(
        f"model.path={smollm2}", "task=jsonl", f"task.path={data}", "task.eval_fraction=0.5",
        "task.system_prompt='Answer with the number only.'", "group_size=2", "max_tokens=2",
    )  # fmt: skip
    policy = load_policy(cfg)
    task, sampler = make_task(cfg.task), make_sampler("torch", policy, cfg)
    problems = task.train_problems(1, random.Random(0)) + task.eval_problems()
    groups = sample_groups(cfg, sampler, task, problems, SamplingSettings(max_tokens=2), 0)
    batch = prepare(cfg, policy, groups).batch  # what the learner trains on
    for problem, rollout in zip(problems, groups.rollouts_N[::2], strict=True):
        messages = [MESSAGES[1]] if isinstance(problem.prompt, list) else []
        messages = messages or [{"role": "user", "content": problem.prompt}]
        expected = policy.tokenizer.apply_chat_template(
            [MESSAGES[0], *messages], add_generation_prompt=True, return_dict=False
        )
        assert rollout.prompt_ids == expected
        assert expected.count(policy.tokenizer.bos_token_id) == 3  # system, user, assistant
        row = batch.prompt_ids_DS[batch.prompt_of_N[groups.rollouts_N.index(rollout)]]
        assert row[-len(expected) :].tolist() == expected
        assert row[: len(row) - len(expected)].eq(policy.tokenizer.pad_token_id).all()
    eval_rollout = sampler.sample([task.eval_problems()[0].prompt], SamplingSettings(max_tokens=1))
    assert eval_rollout[0].prompt_ids in [r.prompt_ids for r in groups.rollouts_N]


@pytest.mark.real_model
def test_first_try_on_smollm2_has_a_nonzero_baseline_and_per_reward_curves(
    smollm2, composed, new_recorder, tmp_path
):
    """The issue's first try, shrunk: plain question strings, numeric answers, no task or
    reward settings. The chat template applies itself, and last_number reads the answer."""
    rng = random.Random(0)
    data = tmp_path / "questions.jsonl"
    with data.open("w") as f:
        for _ in range(20):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            f.write(json.dumps({"prompt": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n")
    cfg = composed(
        f"model.path={smollm2}", "task=jsonl", f"task.path={data}", "task.eval_fraction=0.4",
        "max_tokens=12", "batch_size=2", "group_size=2", "max_steps=1", "compute_post_kl=false",
    )  # fmt: skip
    recorder = new_recorder()
    result = train(cfg, recorder)
    assert recorder.steps[0][metrics.EVAL_GREEDY] > 0
    assert result.baseline_eval is not None
    assert (
        recorder.steps[1][metrics.reward_part("last_number")] == recorder.steps[1][metrics.REWARD]
    )
    baseline = recorder.steps[0]  # the held-out eval per reward too
    assert baseline[metrics.eval_reward_part("last_number")] == baseline[metrics.EVAL_REWARD]


def test_a_zero_baseline_names_the_likely_cause():
    advice = baseline_advice(0.0, True, "off", ["exact_match"], truncated=0.75, max_tokens=8)
    assert advice.startswith("Baseline eval reward is 0%: the chat template is off")
    assert "75% of the completions hit max_tokens=8" in advice
    assert "try task.rewards=[last_number]" in advice
    assert baseline_advice(0.0, False, "none", ["exact_match"], 0.0, 8) == (
        "Baseline eval reward is 0%: the task is likely too hard for this model"
    )
    assert baseline_advice(0.9, True, "applied", [], 0.0, 8).startswith(
        "Baseline eval reward is 90%: little left to learn"
    )
    assert baseline_advice(0.3, True, "applied", [], 0.0, 8) is None
