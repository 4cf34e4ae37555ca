"""Tasks: exact-match reward, stable held-out splits, data files in each format, the default
reward, and the one-line errors for bad data."""

import json
import random

import pytest
from conftest import compose_conf

from trainer.base.errors import ConfigError
from trainer.env.tasks import (
    AdditionTask,
    ArithmeticTask,
    DatasetTask,
    exact_match_reward,
    make_task,
)


@pytest.mark.parametrize(
    ("completion", "finished", "reward"),
    [
        ("12", True, 1.0),
        (" 12 ", True, 1.0),
        ("12", False, 0.0),
        ("13", True, 0.0),
        ("", True, 0.0),
    ],
)
def test_exact_match_needs_the_answer_before_end_of_sequence(completion, finished, reward):
    assert exact_match_reward("12", completion, finished) == reward


def test_addition_split_is_disjoint_and_stable():
    task = AdditionTask(num_digits=2, eval_size=50, seed=3)
    eval_prompts = {p.prompt for p in task.eval_problems()}
    assert len(eval_prompts) == 50
    assert eval_prompts == {
        p.prompt for p in AdditionTask(num_digits=2, eval_size=50, seed=3).eval_problems()
    }
    train = task.train_problems(500, random.Random(0))
    assert not eval_prompts & {p.prompt for p in train}
    assert all(int(p.prompt[:2]) + int(p.prompt[3:5]) == int(p.answer) for p in train)


def test_a_config_saved_before_the_trainers_layering_still_builds_its_task(caplog):
    """Tuned files and MLflow runs from before trainer/ had layers name trainer.tasks."""
    cfg = compose_conf("task._target_=trainer.tasks.AdditionTask", "task.eval_size=7")
    task = make_task(cfg.task)
    assert isinstance(task, AdditionTask) and len(task.eval_problems()) == 7
    assert "moved to trainer.env.tasks.AdditionTask" in caplog.text
    caplog.clear()
    make_task(compose_conf().task)  # today's configs: no warning
    assert "moved" not in caplog.text


def test_jsonl_task(tmp_path):
    path = tmp_path / "qa.jsonl"
    rows = [{"prompt": f"q{i}", "answer": i} for i in range(20)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    task = DatasetTask(str(path), eval_fraction=0.1, seed=0, rewards=["exact_match"])
    assert len(task.eval_problems()) == 2
    problem = task.eval_problems()[0]
    assert task.reward(problem, f" {problem.answer}\n", finished=True) == 1.0
    assert task.reward(problem, problem.answer, finished=False) == 0.0


ROWS = [{"question": f"What is {i} + 1?", "solution": i + 1, "id": i} for i in range(10)] + [
    {"question": [{"role": "user", "content": "What is 9 + 9?"}], "solution": 18, "id": 10}
]


def write(tmp_path, fmt: str):
    """ROWS as a file of `fmt` (the message-list row in JSONL only: Arrow's columns hold one
    type, so a column of a typed format is all strings or all message lists)."""
    import datasets

    rows = ROWS if fmt == "jsonl" else ROWS[:-1]
    if fmt == "jsonl":
        path = tmp_path / "qa.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path, len(rows)
    if fmt == "saved":
        path = tmp_path / "saved"
        split = datasets.DatasetDict(
            {
                "train": datasets.Dataset.from_list(rows[:8]),
                "test": datasets.Dataset.from_list(rows[8:]),
            }
        )
        split.save_to_disk(str(path))
        return path, len(rows)
    data = datasets.Dataset.from_list(rows)
    path = tmp_path / f"qa.{fmt}"
    {"json": data.to_json, "csv": data.to_csv, "parquet": data.to_parquet}[fmt](str(path))
    return path, len(rows)


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "parquet"])
def test_a_data_file_in_each_format_with_mapped_fields(tmp_path, fmt):
    path, count = write(tmp_path, fmt)
    task = DatasetTask(str(path), "question", "solution", eval_fraction=0.2)
    problems = task.eval_problems() + task.train_problems(count - 2, random.Random(0))
    assert sorted(p.answer for p in problems) == sorted(str(r["solution"]) for r in ROWS[:count])
    assert task.rewards.names == ["last_number"]  # every answer is a number
    by_answer = {p.answer: p.prompt for p in problems}
    assert by_answer["3"] == "What is 2 + 1?"
    if count == len(ROWS):  # a message-list prompt survives the format
        assert by_answer["18"] == [{"role": "user", "content": "What is 9 + 9?"}]


def test_message_list_prompts_in_a_parquet_file(tmp_path):
    import datasets

    chats = [
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": q}], "answer": str(i)}
        for i, q in enumerate(["What is 0 + 0?", "What is 0 + 1?", "What is 1 + 1?"])
    ]  # fmt: skip
    datasets.Dataset.from_list(chats).to_parquet(str(tmp_path / "chats.parquet"))
    task = DatasetTask(str(tmp_path / "chats.parquet"), prompt_field="messages", eval_fraction=0.3)
    problem = task.eval_problems()[0]
    assert problem.prompt == next(c["messages"] for c in chats if c["answer"] == problem.answer)


def test_a_saved_dataset_with_named_train_and_eval_splits(tmp_path):
    path, _ = write(tmp_path, "saved")
    task = DatasetTask(str(path), "question", "solution", split="train", eval_split="test")
    assert [p.answer for p in task.eval_problems()] == ["9", "10"]
    assert len(task.train_problems(8, random.Random(0))) == 8
    with pytest.raises(
        ConfigError, match=r"task.eval_split='dev': not a split of .*; it has \['train', 'test'\]"
    ):
        DatasetTask(str(path), "question", "solution", eval_split="dev")


def test_the_default_reward_reads_numbers_out_of_text_and_else_matches_exactly(tmp_path):
    path = tmp_path / "words.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": f"q{i}", "answer": f"w{i}"}) + "\n" for i in range(5))
    )
    assert DatasetTask(str(path)).rewards.names == ["exact_match"]
    assert AdditionTask().rewards.names == ["exact_match"]  # the tiny model's task
    assert ArithmeticTask().rewards.names == ["last_number"]


def test_arithmetic_questions_are_words_with_their_sums():
    task = ArithmeticTask(max_operand=12, eval_size=64, seed=0)
    problems = task.eval_problems()
    assert len(problems) == 64 and len({p.prompt for p in problems}) == 64
    for p in problems + task.train_problems(50, random.Random(1)):
        a, b = p.prompt.removeprefix("What is ").split("?")[0].split(" + ")
        assert int(a) + int(b) == int(p.answer) and max(int(a), int(b)) <= 12
    assert not {p.prompt for p in problems} & {
        p.prompt for p in task.train_problems(105, random.Random(0))
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("max_operand", "eval_size"), [(12, 64), (12, 63), (5, 10)])
def test_no_eval_question_has_its_reversed_twin_in_training(max_operand, eval_size, seed):
    task = ArithmeticTask(max_operand=max_operand, eval_size=eval_size, seed=seed)
    operands = {p.prompt: p.prompt.removeprefix("What is ").split("?")[0] for p in task._train}
    trained = {tuple(q.split(" + ")) for q in operands.values()}
    held_out = [p.prompt.removeprefix("What is ").split("?")[0] for p in task.eval_problems()]
    assert len(held_out) == eval_size
    assert len(trained) + eval_size == (max_operand + 1) ** 2  # every question, once
    for question in held_out:
        a, b = question.split(" + ")
        assert (a, b) not in trained and (b, a) not in trained, question


@pytest.mark.parametrize(
    ("row", "kwargs", "message"),
    [
        ({"q": "hi", "answer": 1}, {}, "task.prompt_field='prompt': row 1 of 'DATA' has no such field; its fields are ['answer', 'q']"),
        ({"prompt": "hi", "a": 1}, {}, "task.answer_field='answer': row 1 of 'DATA' has no such field; its fields are ['a', 'prompt']"),
        ({"prompt": [{"role": "robot", "content": "hi"}], "answer": 1}, {}, "task.path='DATA': row 1, field 'prompt': unknown message role 'robot'; one of ('system', 'user', 'assistant', 'tool')"),
        ({"prompt": [{"role": "user"}], "answer": 1}, {}, "task.path='DATA': row 1, field 'prompt': each message needs a string 'content' (got {'role': 'user'})"),
        ({"prompt": 7, "answer": 1}, {}, "task.path='DATA': row 1, field 'prompt': must be a string or a list of messages"),
        ({"prompt": " ", "answer": 1}, {}, "task.path='DATA': row 1, field 'prompt': is empty; every row needs a prompt"),
        ({"prompt": [{"role": "user", "content": ""}], "answer": 1}, {}, "task.path='DATA': row 1, field 'prompt': is empty; every row needs a prompt"),
        ({"prompt": "hi", "answer": None}, {}, "task.path='DATA': row 1, field 'answer': is empty; every row needs a reference answer"),
        ({"prompt": "hi", "answer": ""}, {}, "task.path='DATA': row 1, field 'answer': is empty; every row needs a reference answer"),
        ({"prompt": "hi", "answer": 1}, {"split": "dev"}, "task.split='dev': not a split of 'DATA'; it has ['train']"),
    ],
)  # fmt: skip
def test_bad_data_is_one_line_naming_what_is_there(tmp_path, row, kwargs, message):
    path = tmp_path / "data.jsonl"
    path.write_text((json.dumps(row) + "\n") * 3)
    with pytest.raises(ConfigError) as error:
        DatasetTask(str(path), **kwargs)
    assert str(error.value) == message.replace("DATA", str(path))


def test_a_path_that_is_not_there_or_not_data(tmp_path):
    with pytest.raises(ConfigError, match=r"task.path='/no/such.csv': no such file or directory"):
        DatasetTask("/no/such.csv")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ConfigError, match="unknown format; one of .jsonl, .json, .csv, .parquet"):
        DatasetTask(str(tmp_path / "notes.txt"))
