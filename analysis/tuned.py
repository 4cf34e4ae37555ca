"""`python -m analysis best`: the tuned YAML of a study's best trial.

One renderer only, the one the sweep writes with (`records.tuned_file.write_tuned`). When the
sweep exported `tuned/<study>.yaml` in this directory for the current best trial, that file is printed as
it is; otherwise (the sweep ran elsewhere, or the file is stale) the best trial's config is
composed again from its recorded overrides with Hydra's compose API and handed to the same
renderer.
"""

from __future__ import annotations

from pathlib import Path

from analysis.load import AnalysisError, StudyData
from analysis.report import no_best_message
from analysis.verdict import study_verdict
from records.sweep import TrialAttr


def tuned_yaml(data: StudyData, cwd: Path | None = None, trl_recipe: bool = False) -> str:
    """The YAML text `+tuned=<study>` composes back, for the best completed trial; with
    trl_recipe, its `trl grpo` recipe (backend.config) with the tuned values filled in."""
    from records.tuned_file import tuned_path

    best_study = data.study
    best = data.best()
    if best is None or best_study is None:
        raise AnalysisError(f"study {data.name!r}: {no_best_message(data)}")
    exported = tuned_path(data.name, cwd)
    if exported.is_file() and not trl_recipe:
        text = exported.read_text()
        if f"best trial: t{best.number}," in text:
            return text
    trial = best_study.trials[best.number]
    overrides = trial.user_attrs.get(TrialAttr.OVERRIDES)
    if overrides is None:
        raise AnalysisError(f"t{best.number} has no recorded overrides; cannot rebuild its config")
    return _render(data, best.number, list(overrides), trl_recipe)


def _render(data: StudyData, number: int, overrides: list[str], trl_recipe: bool) -> str:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import analysis.sweep_job  # noqa: F401  (registers the config schemas before composing)
    from records.tuned_file import render_tuned, tuned_notes
    from trainer.base.config import config_dir

    conf = config_dir()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=conf, version_base="1.3"):
            cfg = compose("sweep", overrides=overrides, return_hydra_config=True)
    except Exception as e:  # a config group renamed since the sweep, a missing +tuned file
        raise AnalysisError(f"cannot compose t{number}'s config again: {e}") from None
    finally:
        GlobalHydra.instance().clear()
    trial = data.study.trials[number]
    verdict = study_verdict(data.study, data.attrs, data.maximize).text
    notes = tuned_notes(data.name, data.storage, trial, data.objective, data.direction, verdict)
    if trl_recipe:
        return _recipe(cfg, overrides, notes)
    return render_tuned(cfg, overrides, notes)


def _recipe(cfg, overrides: list[str], notes: dict) -> str:
    from trainer.backends.trl.tuned_recipe import tuned_recipe
    from trainer.base.errors import ConfigError

    if not cfg.backend.get("config"):
        raise AnalysisError("--trl-recipe: the best trial had no backend.config recipe")
    try:
        notes = {**notes, "reuse": "trl grpo --config <this file>"}
        return tuned_recipe(cfg, overrides, notes)
    except ConfigError as e:
        raise AnalysisError(f"--trl-recipe: {e}") from None
