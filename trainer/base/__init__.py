"""The vocabulary every layer shares: `ConfigError` and the one-line error messages (errors),
the Hydra schemas and the config directory (config), the metric names (metrics) and the
progress bar (progress). Imports nothing else of the trainer; the sweeper and analysis read
these too. Nothing is imported here: `import trainer.base.errors` loads that module alone.
"""
