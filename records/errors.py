"""How an error becomes the one line a person reads, and the error a store raises when it is
set so that it cannot be used. Every floor above reads these; they import nothing."""


def first_line(error: BaseException) -> str:
    """An exception's first line of text (its type's name when it has none): what a person
    reads of an error in a one-line message."""
    lines = str(error).strip().splitlines()
    return lines[0].strip() if lines else type(error).__name__


class StoreUnusable(ValueError):
    """A store (the Optuna storage, the MLflow tracking store) that cannot be used as set: one
    line naming the setting and why, raised before any run starts."""
