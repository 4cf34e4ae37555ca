"""A reward model as a reward (trainer/env/reward_model.py): a local sequence-classification
directory scored as TRL's GRPOTrainer scores one (its own `_calculate_rewards` is the reference),
from a recipe's `reward_model_name_or_path` (first among the rewards, as `trl grpo` puts it) or
a `task.rewards` entry, on both backends; one that cannot score is refused in one line before
any trial."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import compose_conf, needs_trl, run_sweep, study_in, sweep_env
from test_trl_recipe import REWARD, TESTS, resolved, tiny_dir, write_recipe

from records.sweep import TrialAttr
from trainer.backends import validate
from trainer.base.errors import ConfigError
from trainer.env.reward_check import check_rewards, check_task_rewards
from trainer.env.reward_model import TARGET, RewardModel
from trainer.env.tasks import Problem, SplitTask, make_task
from trainer.env.trl_rewards import TrlStyleReward

# The tiny tokenizer knows digits, + - * / = and space: a template of those alone
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
PROMPTS = ["03+04=", "12+13=", "1+1="]
REWARD_OURS = "user_rewards.shorter_is_better"  # a user's function: the worker scores it
COMPLETIONS = ["7", "25", "2 2 2 2"]


def build_reward_model(root: Path, num_labels: int = 1) -> Path:
    """A tiny Llama sequence classifier on the shipped tiny model's config, seeded, its head
    scaled so rewards differ by units, saved with the tiny tokenizer and a chat template."""
    from transformers import AutoConfig, AutoTokenizer, LlamaForSequenceClassification

    config = AutoConfig.from_pretrained(tiny_dir())
    config.num_labels, config.pad_token_id, config.architectures = num_labels, 0, None
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(config)
    torch.nn.init.normal_(model.score.weight, std=1.0)
    root.mkdir(parents=True)
    model.save_pretrained(root)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir())
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(root)
    return root


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory) -> Path:
    return build_reward_model(tmp_path_factory.mktemp("rm") / "tiny-rm")


def by_hand(rm_dir: Path, texts: list[str]) -> list[float]:
    """The score head at each text's last token, one text at a time (no padding)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(rm_dir, num_labels=1).eval()
    tokenizer = AutoTokenizer.from_pretrained(rm_dir)
    values = []
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
            hidden = model.model(ids).last_hidden_state[0, -1]
            values.append(float(model.score(hidden)[0]))
    return values


def conversational(prompts: list[str], completions: list[str]) -> tuple[list, list]:
    return (
        [[{"role": "user", "content": p}] for p in prompts],
        [[{"role": "assistant", "content": c}] for c in completions],
    )


@needs_trl
def test_it_scores_as_trls_own_reward_model_path(rm_dir, tmp_path):
    """Standard and conversational data: ours equals TRL's `_calculate_rewards` on a
    GRPOTrainer given the directory, and the score head read by hand at prompt+completion's
    last token (the chat template here joins the contents); TRL names it as ours does."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", bf16=False,
        per_device_train_batch_size=2, num_generations=2, max_completion_length=4,
    )  # fmt: skip
    trainer = GRPOTrainer(
        AutoModelForCausalLM.from_pretrained(tiny_dir()),
        [str(rm_dir)],
        args,
        train_dataset=Dataset.from_list([{"prompt": "1+1="}] * 4),
        processing_class=AutoTokenizer.from_pretrained(tiny_dir()),
    )
    ours = RewardModel(str(rm_dir))
    assert trainer.reward_func_names == [ours.__name__] == [rm_dir.name]
    hand = by_hand(rm_dir, [p + c for p, c in zip(PROMPTS, COMPLETIONS, strict=True)])
    assert len(set(hand)) == 3  # a head that tells the texts apart
    for prompts, completions in [(PROMPTS, COMPLETIONS), conversational(PROMPTS, COMPLETIONS)]:
        inputs = [{"prompt": p} for p in prompts]
        trl = trainer._calculate_rewards(inputs, prompts, completions, [[1]] * 3)[:, 0].tolist()
        scored = ours(prompts=prompts, completions=completions)
        assert scored == pytest.approx(trl, abs=1e-6)
        assert scored == pytest.approx(hand, abs=1e-4)  # unpadded: float32 rounding apart


def test_a_task_rewards_entry_is_a_trl_style_reward_in_process(rm_dir):
    """`{_target_: ...RewardModel, path: DIR}`: built once, named by its directory, called
    one completion at a time as ours calls TRL-style rewards, never sent to the worker."""
    problems = [Problem(p, c) for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]
    task = SplitTask(problems, problems, [{"_target_": TARGET, "path": str(rm_dir)}, "exact_match"])
    rewards = task.rewards
    assert rewards.names == [rm_dir.name, "exact_match"]
    assert isinstance(rewards.fns[0], TrlStyleReward) and isinstance(rewards.fns[0].fn, RewardModel)
    hand = by_hand(rm_dir, ["03+04=7"])[0]
    assert rewards.parts(problems[0], "7", True)[rm_dir.name] == pytest.approx(hand, abs=1e-4)
    check_rewards(task)  # the preflight's call passes
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(
        {
            "_target_": "trainer.env.tasks.AdditionTask",
            "rewards": [{"_target_": TARGET, "path": str(rm_dir)}, {"_target_": REWARD_OURS}],
        }
    )
    built = make_task(cfg)  # task.reward_timeout's default: the worker takes the user's fn only
    assert built.rewards.worker is not None
    assert set(built.rewards.worker.entries) == {"shorter_is_better"}
    built.rewards.worker.close()


def test_refused_in_one_line_naming_the_setting(tmp_path, rm_dir):
    """A hub name when built; a causal LM's directory (a random head), an empty directory and
    a two-label classifier when the preflight calls it: each one line naming path and error."""
    problems = [Problem("1+1=", "2")]

    def refusal(path: str) -> str:
        with pytest.raises(ConfigError) as refused:
            check_rewards(SplitTask(problems, problems, [{"_target_": TARGET, "path": path}]))
        assert "\n" not in str(refused.value)
        return str(refused.value)

    assert refusal("org/reward-model") == (
        "task.rewards path='org/reward-model': must be a local model directory (no hub downloads)"
    )
    assert refusal(tiny_dir()) == (
        f"task.rewards path={tiny_dir()!r}: not a trained reward model: score.weight not in its "
        "weights (would start random)"
    )
    (tmp_path / "empty").mkdir()
    empty = str((tmp_path / "empty").resolve())
    assert refusal(empty) == (
        f"task.rewards path={empty!r}: does not load as a sequence-classification model "
        f"(ValueError: Unrecognized model in {empty}. Should have a `model_type` key in its "
        "config.json.)"
    )
    two = str(build_reward_model(tmp_path / "two-labels", num_labels=2).resolve())
    assert (
        refusal(two) == f"task.rewards path={two!r}: a classifier of 2 labels; a reward model has 1"
    )


@needs_trl
def test_backend_trl_hands_trl_the_directory_under_our_name(rm_dir):
    """TRL loads and scores the model itself, as `trl grpo` has it do (data.py says why); the
    run renames TRL's reward names to ours, an entry's own `name` included."""
    from transformers import AutoTokenizer

    from trainer.backends.trl.data import training_data
    from trainer.env.prompts import PromptRenderer, prompt_settings

    entry = f"{{_target_:{TARGET},path:'{rm_dir}',name:rm}}"
    cfg = compose_conf("backend=trl", f"task.rewards=[{entry},exact_match]", "max_steps=1")
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir())
    renderer = PromptRenderer(tokenizer, **prompt_settings(cfg.task))
    data = training_data(cfg, make_task(cfg.task), renderer, {tokenizer.eos_token_id})
    assert data.reward_funcs[0] == str(rm_dir.resolve())
    assert data.reward_names == ["rm", "exact_match"]


@needs_trl
def test_a_recipes_reward_model_is_its_first_reward(tmp_path, rm_dir):
    """`reward_model_name_or_path` comes before reward_funcs, as `trl grpo` builds them, so the
    recipe's reward_weights count it first; the preflight calls it; alone it is enough."""
    recipe = write_recipe(
        tmp_path, reward_model_name_or_path=str(rm_dir), reward_funcs=[REWARD],
        reward_weights=[0.5, 1.0],
    )  # fmt: skip
    cfg = resolved(recipe, "task.reward_timeout=0")
    entry = dict(cfg.task.rewards[0])
    assert entry == {
        "_target_": TARGET,
        "path": str(rm_dir.resolve()),
        "key": "reward_model_name_or_path",
        "chat_template_kwargs": None,
        "name": rm_dir.name,
    }
    assert list(cfg.task.reward_weights) == [0.5, 1.0]
    validate(cfg)
    check_task_rewards(cfg.task, set())
    rewards = make_task(cfg.task).rewards
    assert (rewards.names, rewards.weights) == ([rm_dir.name, "accuracy_reward"], [0.5, 1.0])
    alone = tmp_path / "alone"
    alone.mkdir()
    only = resolved(write_recipe(alone, reward_model_name_or_path=str(rm_dir), reward_funcs=None))
    assert [r["name"] for r in only.task.rewards] == [rm_dir.name]


@needs_trl
@pytest.mark.parametrize(
    ("path", "overrides", "message"),
    [
        ("org/rm", [], "reward_model_name_or_path='org/rm': must be a local model directory"),
        ("TINY", [], "reward_model_name_or_path={tiny!r}: not a trained reward model"),
        (
            "RM",
            ["+backend.grpo.chat_template_kwargs={add_generation_prompt:true}"],
            "backend.grpo.chat_template_kwargs={{'add_generation_prompt': True}}: TRL applies "
            "them to the reward model",
        ),
    ],
    ids=["hub name", "causal LM", "template kwargs"],
)
def test_a_recipes_reward_model_that_cannot_score_is_refused(
    tmp_path, rm_dir, path, overrides, message
):
    path = {"TINY": tiny_dir(), "RM": str(rm_dir)}.get(path, path)
    recipe = write_recipe(tmp_path, reward_model_name_or_path=path, reward_funcs=[REWARD])
    with pytest.raises(ConfigError) as refused:
        cfg = resolved(recipe, "task.reward_timeout=0", *overrides)
        validate(cfg)
        check_task_rewards(cfg.task, set())
    line = str(refused.value)
    assert "\n" not in line and line.startswith(message.format(tiny=tiny_dir())), line


@needs_trl
@pytest.mark.slow
def test_a_reward_model_sweeps_on_both_backends(tmp_path):
    """A recipe with a reward model over two learning rates (TRL loads and scores it), and the
    same model as a task.rewards entry on our backend: every trial COMPLETEs with the reward
    model's reward logged at each step and in its held-out eval."""
    rm = build_reward_model(tmp_path / "tiny-rm")
    env = sweep_env(tmp_path)
    env["PYTHONPATH"] = f"{TESTS}:{env.get('PYTHONPATH', '')}"
    trl_dir, ours_dir = tmp_path / "trl", tmp_path / "ours"
    trl_dir.mkdir()
    ours_dir.mkdir()
    recipe = write_recipe(trl_dir, reward_model_name_or_path=str(rm), reward_funcs=[REWARD])
    small = ("max_steps=2", "batch_size=2", "group_size=2", "max_tokens=4", "eval_every=0")
    sweeps = {
        trl_dir: ["backend=trl", f"backend.config={recipe}", "lr=1e-3,1e-2", *small],
        ours_dir: [
            "backend=ours",
            f"task.rewards=[{{_target_:{TARGET},path:'{rm}'}},exact_match]",
            "lr=1e-3",
            "task.eval_size=8",
            *small,
        ],
    }
    from mlflow.tracking import MlflowClient

    for where, args in sweeps.items():
        env["MLFLOW_TRACKING_URI"] = f"sqlite:///{where}/mlflow.db"
        done = run_sweep(where, *args, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        client = MlflowClient(env["MLFLOW_TRACKING_URI"])
        for trial in study_in(where).trials:
            assert trial.state.name == "COMPLETE"
            run_id = trial.user_attrs[TrialAttr.MLFLOW_RUN_ID]
            steps = [m.step for m in client.get_metric_history(run_id, "reward/tiny-rm")]
            assert sorted(steps) == [1, 2], (where.name, steps)
            assert client.get_metric_history(run_id, "eval/reward/tiny-rm")
