"""Stage 2, the study: where the plan lives once it is decided. The storage, the study and its
MLflow parent run, the queue of slots workers take trials from, and trials lost to the
infrastructure told apart from trials that failed."""
