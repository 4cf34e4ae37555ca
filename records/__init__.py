"""What runs and sweeps record, and the stores that keep it: the ground floor the trainer, the
sweeper and the analysis all stand on. It imports none of them (tests/test_import_graph.py).

  metrics         the per-step metric names a training run logs
  sweep           what a sweep records: MLflow tags and metrics, Optuna attrs, trial states,
                  one seed's record (Replicate) and how it goes in and out of a store
  defaults        where records go unless a setting says otherwise (storage, experiment)
  errors          an error as the one line a person reads; a store set so it cannot be used
  database        databases that may blink: drivers, retries, creation races
  leases          locks a database restart does not drop, the writes they fence, schema_lock
  locks           flock on a local file several processes share
  sqlite_schema   a SQLite store's tables made in one transaction; another client's waited on
  tracking        MLflow: every write of the project, through tracking_store's client
  tracking_store  MLflow's store checked, created safely, every call retried (its client)
  optuna_storage  Optuna's storage opened safely, every call retried, the plan's lock
  tuned_file      tuned/<study>.yaml: the best trial's settings, written and read back

docs/records.md describes every record for people. Nothing is imported here: `import
records.metrics` loads that module alone.
"""
