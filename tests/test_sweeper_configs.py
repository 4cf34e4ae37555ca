"""Configs of the sweeper, composed with Hydra's compose API from the real conf/: the tuned
config composes back into the trial's values, and the search presets parse."""

from __future__ import annotations

import pytest
import yaml
from conftest import compose_conf
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from records.tuned_file import tuned_path, write_tuned
from sweeper.plan.search_sampler import choose_search_sampler
from sweeper.plan.space import parse_space


def _compose(config_name: str, overrides: list[str], hydra_node: bool = False):
    return compose_conf(*overrides, config_name=config_name, hydra_node=hydra_node)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the search path plugin adds the cwd when Hydra starts
    yield tmp_path
    GlobalHydra.instance().clear()


def test_tuned_file_composes_back_into_the_trial_values(in_tmp):
    overrides = ["max_steps=3", "task.eval_size=16", "loss=ppo", "lr=2e-05", "group_size=8"]
    best = _compose("sweep", overrides, hydra_node=True)
    write_tuned(tuned_path("s1"), best, overrides, {"study": "s1"})

    text = tuned_path("s1").read_text()
    assert text.startswith("# @package _global_\n# study: s1\n")
    body = yaml.safe_load(text)
    assert body["defaults"] == [{"override /loss": "ppo"}, "_self_"]
    assert body["lr"] == 2e-05 and body["group_size"] == 8 and body["task"] == {"eval_size": 16}

    for app in ("config", "sweep"):  # python -m trainer and python -m sweeper
        cfg = _compose(app, ["+tuned=s1"])
        assert cfg.loss.name == "ppo" and cfg.loss.clip_high == best.loss.clip_high
        assert (cfg.lr, cfg.group_size, cfg.max_steps) == (2e-05, 8, 3)
        assert cfg.task.eval_size == 16 and cfg.task.num_digits == best.task.num_digits


def test_a_sweep_started_from_a_tuned_config_inlines_it(in_tmp):
    first = ["loss=ppo", "lr=2e-05", "group_size=8"]
    write_tuned(tuned_path("s1"), _compose("sweep", first, hydra_node=True), first, {})
    second = ["+tuned=s1", "kl_penalty_coef=0.05", "group_size=4"]
    write_tuned(tuned_path("s2"), _compose("sweep", second, hydra_node=True), second, {})

    body = yaml.safe_load(tuned_path("s2").read_text())
    assert "tuned" not in str(body.get("defaults"))  # stands on its own
    cfg = _compose("config", ["+tuned=s2"])
    assert (cfg.loss.name, cfg.lr, cfg.group_size, cfg.kl_penalty_coef) == ("ppo", 2e-05, 4, 0.05)


@pytest.mark.parametrize("preset", ["rl", "rl_hf"])
def test_search_presets_compose_into_a_tpe_space(in_tmp, preset):
    cfg = _compose("sweep", [f"+search={preset}"], hydra_node=True)
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_ == "hydra_plugins.grpo_sweeper.grpo_sweeper.GRPOSweeper"
    space = parse_space(OmegaConf.to_container(sweeper.params), ["group_size=4,8"])
    assert set(space.params) == {
        "lr",
        "group_size",
        "num_substeps",
        "kl_penalty_coef",
        "temperature",
    }
    assert space.params["group_size"].values == (4, 8)  # the command line wins
    assert space.log_params == ["lr"]
    assert choose_search_sampler(sweeper.sampler, space, sweeper.n_trials, None).name == "tpe"


def test_the_working_directory_is_on_the_search_path_of_our_apps_only(in_tmp):
    (in_tmp / "tuned").mkdir()
    (in_tmp / "tuned" / "x.yaml").write_text("# @package _global_\nlr: 0.005\n")
    assert _compose("config", ["+tuned=x"]).lr == 0.005  # ours finds the tuned file
    foreign = in_tmp / "foreign"
    foreign.mkdir()
    (foreign / "app.yaml").write_text("a: 1\n")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(foreign), version_base="1.3"):
        cfg = compose("app", overrides=["+tuned=x"])
    assert "lr" not in cfg and cfg.tuned == "x"  # another Hydra app: no `tuned` group there
