"""Reward functions of a user's own, for tests that name them by `_target_`."""


def shorter_is_better(problem, completion: str, finished: bool) -> float:
    return 1.0 / (1 + len(completion))


def broken(problem, completion: str, finished: bool) -> float:
    raise KeyError("no_such_key")


def not_a_number(problem, completion: str, finished: bool):
    return "yes"
