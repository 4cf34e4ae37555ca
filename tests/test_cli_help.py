"""`--help` of both apps lists the groups a user picks and every key with its default and its
line, in a directory that holds a finished sweep's outputs; `-m` with `--cfg`/`--info` shows the
config or says in one line why it cannot."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.sweep_job import SweepJobConfig
from records.sweep import BINDING_KEY
from sweeper.plan.settings_schema import GRPOSweeperConf
from trainer.base.config import TrainConfig

GROUPS = [
    "backend: ours, trl",
    "loss: bnpo, dapo, dr_grpo, grpo, importance_sampling, ppo, trl_default",
    "model: hf, tiny",
    "sampler: torch, vllm",
    "search: rl, rl_hf",
    "task: addition, addition_length, arithmetic, jsonl, mytask",
    "tuned: grpo-0123",
]


def _cli(cwd: Path, app: str, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", app, *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture
def after_a_sweep(tmp_path: Path) -> Path:
    """The folders a finished sweep leaves (each holds YAML), the tuned file, a user's task."""
    leftovers = {
        "mlruns/1/0a1b/artifacts/config.yaml": "lr: 0.001\n",
        "multirun/2026-11-29/01-52-36/t0-s0/.hydra/config.yaml": "lr: 0.001\n",
        "multirun/2026-11-29/01-52-36/t0-s0/.hydra/hydra.yaml": "hydra: {}\n",
        "multirun/2026-11-29/01-52-36/t0-s0/.hydra/overrides.yaml": "- lr=0.001\n",
        "outputs/run/.hydra/config.yaml": "lr: 0.001\n",
        "tuned/grpo-0123.yaml": "# @package _global_\nlr: 0.005\n",
        "task/mytask.yaml": "defaults:\n  - addition\n  - _self_\neval_size: 7  # mine\n",
    }
    for name, text in leftovers.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def _settings(help_text: str) -> dict[str, tuple[str, str]]:
    """{key: (default, line)} of the help's settings rows (`  key=value  line`)."""
    rows = {}
    for line in help_text.splitlines():
        if line.startswith("  ") and not line.startswith("   ") and "=" in line:
            setting, _, note = line.strip().partition("  ")
            key, _, default = setting.partition("=")
            rows[key] = (default, note.strip())
    return rows


def _leaves(kind: type, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(kind):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default):
            keys += _leaves(type(default), f"{prefix}{f.name}.")
        elif not f.name.startswith("_"):
            keys.append(prefix + f.name)
    return keys


def test_sweeper_help_lists_groups_and_every_key_beside_a_finished_sweep(after_a_sweep):
    done = _cli(after_a_sweep, "sweeper", "--help")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    groups = text.split("== Configuration groups ==")[1].split("== Settings ==")[0]
    assert [line for line in groups.splitlines() if ": " in line] == GROUPS
    for leftover in ("mlruns", "multirun", "outputs", "schema", "_schema", ".hydra"):
        assert leftover not in groups
    rows = _settings(text)
    keys = [k for k in _leaves(SweepJobConfig) if not k.startswith(f"{BINDING_KEY}.")]
    keys = [k for k in keys if k != "task"] + [
        f"hydra.sweeper.{k}" for k in _leaves(GRPOSweeperConf)
    ]
    assert [k for k in keys if k not in rows] == []
    assert [k for k, (_, note) in rows.items() if not note] == []
    assert rows["lr"] == (
        "0.002",
        'learning rate, or "auto": get_lr() from the model\'s hidden size and',
    )
    assert rows["hydra.sweeper.max_seeds"][0] == "3"
    assert rows["hydra.sweeper.pruner"] == ("none", "(none, median, hyperband, forecast)")
    assert rows["task.eval_size"] == ("400", "held-out problems, never used for training")
    assert not any(k.startswith(f"{BINDING_KEY}.") for k in rows)  # the sweeper fills those in


def test_trainer_help_reads_a_users_group_and_leaves_the_sweeper_out(after_a_sweep):
    done = _cli(after_a_sweep, "trainer", "--help", "task=mytask")
    assert done.returncode == 0, done.stderr
    rows = _settings(done.stdout)
    assert rows["task.eval_size"] == ("7", "mine")  # the user's file, over the one it extends
    assert rows["task.num_digits"] == ("2", "operands from 0 to 99")
    assert not any(k.startswith("hydra.") for k in rows)
    assert [k for k in _leaves(TrainConfig) if k != "task" and k not in rows] == []


def test_multirun_with_cfg_or_info_shows_the_config_or_says_why_not(after_a_sweep):
    shown = _cli(after_a_sweep, "sweeper", "-m", "lr=1e-3", "--cfg", "job")
    assert shown.returncode == 0, shown.stderr
    assert "\nlr: 0.001\n" in shown.stdout
    info = _cli(after_a_sweep, "sweeper", "-m", "lr=1e-3", "--info", "searchpath")
    assert info.returncode == 0, info.stderr
    assert "grpo-cwd://" in info.stdout
    swept = _cli(after_a_sweep, "sweeper", "-m", "lr=1e-3,2e-3", "--cfg", "job")
    assert swept.returncode == 1
    assert swept.stderr == (
        "error: --cfg shows one config and lr=1e-3,2e-3 sweeps several: give one value "
        "(lr=0.001) to see that trial's config\n"
    )
