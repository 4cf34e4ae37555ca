"""Where records go unless a setting says otherwise. Imports nothing, so a config schema that
Hydra reads at every start (and a command line's --help) can quote them without loading a
store's library."""

DEFAULT_STORAGE = "sqlite:///sweeps.db"  # the Optuna storage: hydra.sweeper.storage
DEFAULT_EXPERIMENT = "grpo"  # the MLflow experiment: `experiment=`
