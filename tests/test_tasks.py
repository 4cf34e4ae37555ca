"""Tasks: exact-match reward, stable held-out splits, JSONL rows."""

import json
import random

import pytest

from trainer.tasks import AdditionTask, JsonlTask, exact_match_reward


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


def test_jsonl_task(tmp_path):
    path = tmp_path / "qa.jsonl"
    rows = [{"prompt": f"q{i}", "answer": i} for i in range(20)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    task = JsonlTask(str(path), eval_fraction=0.1, seed=0)
    assert len(task.eval_problems()) == 2
    problem = task.eval_problems()[0]
    assert task.reward(problem, f" {problem.answer}\n", finished=True) == 1.0
    assert task.reward(problem, problem.answer, finished=False) == 0.0
