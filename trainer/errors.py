"""The error every check raises for a setting that cannot work (trainer/validation.py runs
them); its own module so that any layer can raise it without importing the checks."""


class ConfigError(ValueError):
    """A setting that cannot work; the message names the parameter, the value and the rule."""
