"""Errors: the one type a user sees from the sweeper (one line, exit code 1), and the
one-line form of a trial's failure."""


class SweepError(Exception):
    """A setting or search space that cannot work; the message names what and why."""


def fail_reason(error: BaseException) -> str:
    """A trial's `fail_reason`: the exception type and the first line of its message."""
    message = str(error).strip().splitlines()
    return f"{type(error).__name__}: {message[0]}" if message else type(error).__name__
