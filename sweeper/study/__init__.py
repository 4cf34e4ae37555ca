"""Stage 2, the study: where the plan lives once it is decided. The study and its MLflow parent
run (create), the queue of slots workers take trials from (slots), trials lost to the
infrastructure told apart from trials that failed (recovery), and the heartbeats of the trials
in flight (heartbeat). The storage itself is records/optuna_storage.py."""
