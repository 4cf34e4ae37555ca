"""The vocabulary every layer shares: `ConfigError` and the one-line error messages (errors),
the Hydra schemas and the config directory (config), the text of `--help` read from the
schemas' comments (config_help), every command-line key checked against the config before
Hydra runs, for `python -m trainer` and `python -m sweeper` alike (known_keys), the progress
bar (progress) and the timer
that records a block's seconds under its metric name (timing; the names are records.metrics).
Imports nothing else of the trainer; the sweeper and analysis read these too. Nothing is imported here:
`import trainer.base.errors` loads that module alone.
"""
