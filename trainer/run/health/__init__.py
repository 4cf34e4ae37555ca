"""Run health, split by job: rules (what a rule and a breach are, the defaults), settings
(rules from their settings, checked), monitor (the rules checked after every step), replay
(the rules on a recorded run)."""

from trainer.run.health.monitor import HealthMonitor, first_to_prune
from trainer.run.health.replay import replay, replay_run, warnings
from trainer.run.health.rules import (
    EARLY_FACTOR,
    GUARD_WINDOW,
    LENGTH_GROWTH,
    POST_UPDATE_KL_FACTOR,
    POST_UPDATE_KL_RISE,
    SYMPTOMS,
    WORDS,
    Action,
    Breach,
    Check,
    Guard,
    HealthRule,
    Unit,
    default_rules,
    failure_mode_rules,
    guard_words,
)
from trainer.run.health.settings import rules_from_settings
