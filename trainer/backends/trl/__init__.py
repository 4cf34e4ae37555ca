"""TRL's GRPOTrainer as a backend (being built: see README, "Sweeping a TRL run")."""
