"""tuned/<study>.yaml: the composed config of the trial the verdict names best, rewritten
whenever that trial changes, and once more at the end so that its notes carry the final
verdict. Written quietly: the verdict's last lines name it."""

from __future__ import annotations

import optuna
from omegaconf import DictConfig

from analysis.verdict import Verdict, named_trial, study_verdict
from records.sweep import TrialAttr
from records.tuned_file import tuned_notes, tuned_path, write_tuned
from sweeper.plan.preflight import compose
from sweeper.plan.settings import SweepSettings


class TunedFile:
    """The tuned file of one study, and which trial it was last written for."""

    def __init__(
        self, name: str, settings: SweepSettings, config_loader, config: DictConfig
    ) -> None:
        self.name, self.s = name, settings
        self.config_loader, self.config = config_loader, config
        self.best_written: int | None = None

    def update(
        self, study: optuna.Study, rewrite: bool = False, named: Verdict | None = None
    ) -> None:
        """Rewrite tuned/<study>.yaml whenever the verdict names a new best trial (rewrite: even
        for the same best, as at the end, for the final verdict; named: that verdict, when the
        caller has it)."""
        if rewrite:
            self.best_written = None
        trials = study.get_trials(deepcopy=False)
        named = named or study_verdict(study, study.user_attrs, self.s.maximize)
        best = named_trial(trials, named, self.s.maximize)
        if best is None or best.number == self.best_written:
            return
        overrides = best.user_attrs[TrialAttr.OVERRIDES]
        cfg = compose(self.config_loader, self.config, overrides, keep_hydra=True)
        verdict = named.text
        notes = tuned_notes(
            self.name, self.s.storage, best, self.s.objective, self.s.direction, verdict
        )
        path = tuned_path(self.name)
        write_tuned(path, cfg, overrides, notes)
        self.best_written = best.number
