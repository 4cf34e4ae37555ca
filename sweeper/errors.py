"""The one error type a user sees from the sweeper: one line, exit code 1."""


class SweepError(Exception):
    """A setting or search space that cannot work; the message names what and why."""
