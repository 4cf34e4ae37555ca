"""Pure unit tests of the sweeper's parts: search-space parsing, sampler choice, the KL
prune rule, study names, preflight points and storage URL checks."""

from __future__ import annotations

import pickle

import optuna
import pytest
from conftest import compose_conf
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from records.errors import StoreUnusable
from records.optuna_storage import open_storage
from sweeper import SweepError
from sweeper.plan.preflight import MAX_COMBINATIONS, configurations_to_check
from sweeper.plan.search_sampler import choose_search_sampler
from sweeper.plan.settings import resolve_settings, resolve_url
from sweeper.plan.settings_schema import GRPOSweeperConf
from sweeper.plan.space import parse_space
from sweeper.plan.sweep_plan import default_study_name
from sweeper.sweep.stopping import TrialPruned
from trainer.run.health import HealthMonitor, HealthRule


def test_choices_ranges_and_intervals_become_distributions():
    space = parse_space(
        {},
        [
            "group_size=4,8",
            "loss=choice(ppo,dapo)",
            "num_substeps=range(1,5)",
            "temperature=interval(0.7,1.0)",
            "lora_rank=int(interval(4,16))",
            "lr=tag(log, interval(1e-4, 1e-2))",
            "max_steps=5",
        ],
    )
    p = space.params
    assert p["group_size"].distribution == CategoricalDistribution([4, 8])
    assert p["loss"].values == ("ppo", "dapo")
    assert p["num_substeps"].values == (1, 2, 3, 4)
    assert p["num_substeps"].distribution == IntDistribution(1, 4)
    assert p["temperature"].distribution == FloatDistribution(0.7, 1.0)
    assert p["lora_rank"].distribution == IntDistribution(4, 16)
    assert p["lr"].distribution == FloatDistribution(1e-4, 1e-2, log=True)
    assert p["lr"].endpoints == (1e-4, 1e-2)
    assert space.specs["lr"] == "tag(log, interval(1e-4, 1e-2))"  # as typed, for the records
    assert space.log_params == ["lr"]
    assert space.fixed == ["max_steps=5"]
    assert not space.is_discrete


def test_preset_params_merge_and_the_command_line_wins():
    preset = {"lr": "tag(log, interval(1e-3, 1e-2))", "group_size": "4,8,16"}
    space = parse_space(preset, ["group_size=2,4", "+tuned=abc"])
    assert space.params["group_size"].values == (2, 4)
    assert "lr" in space.params
    assert space.fixed == ["+tuned=abc"]


def test_a_key_given_twice_on_the_command_line_is_an_error():
    with pytest.raises(SweepError, match="group_size is given twice"):
        parse_space({}, ["group_size=2,4", "lr=1e-3", "group_size=2"])


def test_trial_overrides_round_trip_values():
    space = parse_space({}, ["lr=1e-5,2e-5", "loss=ppo,dapo", "+foo=1,2", "max_steps=3"])
    overrides = space.overrides({"lr": 2e-05, "loss": "ppo", "foo": 1})
    assert overrides == ["max_steps=3", "lr=2e-05", "loss=ppo", "+foo=1"]


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        ("lr=interval(1e-2,1e-4)", "low < high"),
        ("lr=interval(0.1,0.1)", "low < high"),
        ("lr=tag(log, interval(0, 1e-2))", "above 0"),
        ("group_size=range(8,2)", "empty"),
        ("lr=interval(1e-4", "malformed"),
    ],
)
def test_bad_search_spaces_fail_with_one_line(argument, message):
    with pytest.raises(SweepError, match=message) as info:
        parse_space({}, [argument])
    assert "\n" not in str(info.value)


def test_auto_sampler_is_a_grid_for_choices_and_tpe_for_ranges():
    grid = choose_search_sampler("auto", parse_space({}, ["a=1,2", "b=range(0,3)"]), 50, None)
    assert grid.is_grid and grid.planned == 6
    tpe = choose_search_sampler("auto", parse_space({}, ["a=1,2", "b=interval(0,1)"]), 7, None)
    assert tpe.name == "tpe" and tpe.planned == 7
    assert isinstance(tpe.optuna_sampler.base, optuna.samplers.TPESampler)  # kept off breaches
    with pytest.raises(SweepError, match="continuous range"):
        choose_search_sampler("grid", parse_space({}, ["b=interval(0,1)"]), 5, None)


def test_prune_exception_carries_its_breach_through_pickling_for_process_launchers():
    rule = HealthRule(name="kl", metric="kl_pre_post_v2", check="above", bound=0.01)
    breach = HealthMonitor([rule]).check(2, {"kl_pre_post_v2": 0.5})
    error = pickle.loads(pickle.dumps(TrialPruned(breach)))
    assert isinstance(error, optuna.TrialPruned)
    assert error.breach == breach and error.breach.step == 2
    assert str(error) == str(breach)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"n_trials": 0}, "hydra.sweeper.n_trials=0: must be >= 1"),
        ({"seeds": 0}, "hydra.sweeper.seeds=0: must be an integer >= 1, or auto"),
        ({"n_jobs": 0}, "hydra.sweeper.n_jobs=0: must be >= 1"),
        ({"max_failure_rate": 2.0}, "hydra.sweeper.max_failure_rate=2.0: must be in [0, 1]"),
        ({"grace_period": 10}, "hydra.sweeper.grace_period=10: must be longer than heartbeat"),
        ({"kl_threshold": 0.0}, "hydra.sweeper.kl_threshold=0.0: must be > 0"),
        ({"storage": "foo"}, "hydra.sweeper.storage='foo': not a database URL"),
        ({"health": {"a": 1}}, "hydra.sweeper.health={'a': 1}: must be a list of rules, or null"),
    ],
)
def test_sweeper_settings_are_checked_once_with_one_line_errors(setting, message):
    with pytest.raises(SweepError) as error:
        resolve_settings(GRPOSweeperConf(**setting), config_kl_threshold=0.01)
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_settings_resolve_the_kl_threshold_and_health_rules():
    s = resolve_settings(GRPOSweeperConf(), config_kl_threshold=0.02)
    assert s.kl_threshold == 0.02 and s.health_rules and s.maximize
    assert resolve_settings(GRPOSweeperConf(health=[]), 0.01).health_rules == ()


def test_a_misspelt_choice_fails_when_the_config_is_composed():
    with pytest.raises(Exception, match="bayes"):
        compose_conf("hydra.sweeper.sampler=bayes", config_name="sweep", hydra_node=True)


def test_default_study_name_is_stable_and_order_free():
    s = resolve_settings(GRPOSweeperConf(), config_kl_threshold=0.01)
    a = parse_space({}, ["group_size=4,8", "lr=1e-5,2e-5", "max_steps=3"])
    b = parse_space({}, ["max_steps=3", "lr=1e-5,2e-5", "group_size=4,8"])
    search_sampler = choose_search_sampler("auto", a, 10, None)
    assert default_study_name(a, search_sampler, s) == default_study_name(b, search_sampler, s)
    c = parse_space({}, ["group_size=4,8", "lr=1e-5,2e-5", "max_steps=4"])
    assert default_study_name(a, search_sampler, s) != default_study_name(c, search_sampler, s)
    assert default_study_name(a, search_sampler, s).startswith("grpo-")


def test_preflight_points_cover_grid_and_range_endpoints():
    space = parse_space({}, ["group_size=2,4", "lr=interval(1e-3,1e-2)"])
    assert list(configurations_to_check(space)) == [
        {"group_size": 2, "lr": 1e-3},
        {"group_size": 2, "lr": 1e-2},
        {"group_size": 4, "lr": 1e-3},
        {"group_size": 4, "lr": 1e-2},
    ]
    big = parse_space({}, ["a=range(0,20)", "b=range(0,20)"])  # 400 > MAX_COMBINATIONS
    checked = list(configurations_to_check(big))
    assert len(checked) == 40 < MAX_COMBINATIONS
    assert {p["a"] for p in checked} == set(range(20))


def test_storage_urls_are_checked(tmp_path):
    assert resolve_url("sqlite:///sweeps.db").endswith("/sweeps.db")
    assert resolve_url("sqlite:///sweeps.db").startswith("sqlite:////")
    with pytest.raises(SweepError, match="not a database URL"):
        resolve_url("sweeps.db")
    with pytest.raises(StoreUnusable, match="cannot open"):
        open_storage(f"sqlite:///{tmp_path}/missing/dir/x.db")
    assert not (tmp_path / "missing").exists()
