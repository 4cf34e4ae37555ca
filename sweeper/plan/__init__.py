"""Stage 1, the plan: what a sweep will run, decided and checked before anything heavy loads
(no MLflow, PEFT, transformers or training code is imported by this stage)."""
