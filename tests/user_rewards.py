"""Reward functions of a user's own, for tests that name them by `_target_`."""


def shorter_is_better(problem, completion: str, finished: bool) -> float:
    return 1.0 / (1 + len(completion))


def broken(problem, completion: str, finished: bool) -> float:
    raise KeyError("no_such_key")


def not_a_number(problem, completion: str, finished: bool):
    return "yes"


def exact(problem, completion: str, finished: bool) -> float:
    """exact_match as a user's own function: scored in the reward worker process."""
    return float(finished and completion.strip() == problem.answer.strip())


def hangs_twice(problem, completion: str, finished: bool) -> float:
    """exact, but calls HANG_AT (e.g. "5,9"; counted in ./reward_calls) never return."""
    import os
    import time
    from pathlib import Path

    counter = Path("reward_calls")
    calls = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(calls))
    if str(calls) in os.environ.get("HANG_AT", "").split(","):
        time.sleep(3600)
    return exact(problem, completion, finished)


def hangs(problem, completion: str, finished: bool) -> float:
    import time

    time.sleep(3600)
    return 0.0


def hangs_trl(completions, **_) -> list[float]:
    """A TRL-style reward that never returns."""
    import time

    time.sleep(3600)
    return [0.0] * len(completions)


def column_bonus(completions, bonus, **_) -> list[float]:
    """A TRL-style reward scoring each completion with its dataset row's `bonus` column; what
    it got is appended to the file $REWARD_SEEN (one JSON list a call)."""
    import json
    import os

    with open(os.environ["REWARD_SEEN"], "a") as seen:
        seen.write(json.dumps(bonus) + "\n")
    return [float(b) for b in bonus]


def always_one(problem, completion: str, finished: bool) -> float:
    """Every completion scores alike: no group has an advantage to learn from."""
    return 1.0


def longer_is_better(problem, completion: str, finished: bool) -> float:
    """Pays for length: a policy trained on it stops ending its answers."""
    return float(len(completion))


# TRL's documentation's rewards for a conversational dataset, as a TRL user writes them.


def accuracy_reward(completions, solution, **kwargs) -> list[float]:
    """1.0 when the completion holds the row's `solution`; each call's prompts and completions
    are appended to $REWARD_SEEN when it is set (one JSON object a call)."""
    import json
    import os

    if "REWARD_SEEN" in os.environ:
        with open(os.environ["REWARD_SEEN"], "a") as seen:
            shown = {"prompts": kwargs["prompts"], "completions": completions}
            seen.write(json.dumps(shown) + "\n")
    contents = [completion[0]["content"] for completion in completions]
    return [1.0 if str(s) in c else 0.0 for c, s in zip(contents, solution, strict=True)]


def think_format_reward(completions, **kwargs) -> list[float]:
    import re

    pattern = r"^<think>.*?</think>.*$"
    contents = [completion[0]["content"] for completion in completions]
    return [1.0 if re.match(pattern, c, re.DOTALL) else 0.0 for c in contents]


def one_too_many(completions, **kwargs) -> list[float]:
    return [0.0] * (len(completions) + 1)


def one_too_few(completions, **kwargs) -> list[float]:
    return [0.0] * (len(completions) - 1)


def reads_text(completions, **kwargs) -> list[float]:
    """A TRL-style reward written for standard (string) completions."""
    return [float(c.strip() == "") for c in completions]
