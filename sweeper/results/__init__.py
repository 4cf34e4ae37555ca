"""Stage 4, the results: the sweep's MLflow runs and what the terminal shows."""
