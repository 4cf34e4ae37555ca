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


def hangs_sometimes(problem, completion: str, finished: bool) -> float:
    """Never returns on completions that start with "1" (a few of the tiny model's)."""
    if completion.startswith("1"):
        import time

        time.sleep(3600)
    return exact(problem, completion, finished)


def hangs(problem, completion: str, finished: bool) -> float:
    import time

    time.sleep(3600)
    return 0.0
