"""The error every check raises for a setting that cannot work (trainer/run/validation.py runs
them), a failed trial's one-line reason and a lost rank; its own module so that any layer (the
sweeper and analysis too) can use them without importing the checks. The one line itself is
records.errors.first_line."""

from records.errors import first_line


class ConfigError(ValueError):
    """A setting that cannot work; the message names the parameter, the value and the rule."""


def fail_reason(error: BaseException) -> str:
    """A failed trial's `fail_reason`: the exception type and its first line."""
    return (
        f"{type(error).__name__}: {first_line(error)}"
        if str(error).strip()
        else type(error).__name__
    )


class RankLost(RuntimeError):
    """A rank of a run over several processes died without a word (kill -9, the OOM killer):
    lost infrastructure, like an unreachable store, not the configuration's failure; the
    sweep's job records nothing and the sweeper queues the point again."""
