"""A regular install works without the checkout: the wheel carries the configs, and the
trainer, the sweeper and `+tuned=` run from an empty directory outside the checkout.

The wheel goes into a fresh virtual environment that sees the already-installed
dependencies (torch and the rest are not installed again) but not this checkout."""

from __future__ import annotations

import importlib.util
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ONE_SEED

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TINY = ["batch_size=2", "group_size=2", "task.eval_size=8", "eval_every=0"]


def run(python: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_TRACKING_URI")}
    return subprocess.run(
        [str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv's python with the wheel installed (regular install, no -e)."""
    root = tmp_path_factory.mktemp("wheel")
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-w", str(root), "."]
    subprocess.run(build, cwd=ROOT, check=True, capture_output=True, timeout=600)
    (wheel,) = root.glob("grpo_sweeper-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    # The dependencies come from the environment running the tests, which may itself be a
    # venv: `--system-site-packages` would expose the base interpreter's packages instead.
    # A .pth file adds this environment's package folders after the new venv's own, and
    # without processing their .pth files, so the checkout's editable install stays out.
    probe = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    venv_packages = subprocess.run(
        [str(python), "-c", probe], check=True, capture_output=True, text=True
    ).stdout.strip()
    parent_packages = [p for p in site.getsitepackages() if Path(p).is_dir()]
    Path(venv_packages, "parent_environment.pth").write_text("\n".join(parent_packages) + "\n")
    # Outside the checkout and without PYTHONPATH: the build leaves grpo_sweeper.egg-info in
    # the checkout, and pip, seeing it on sys.path, would call the wheel already installed.
    done = run(python, root, "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel))
    assert done.returncode == 0, done.stderr[-2000:]
    return python


def test_the_installed_package_is_the_wheel_not_the_checkout(installed, tmp_path):
    probe = "import trainer; from trainer.base.config import config_dir; print(trainer.__file__); print(config_dir())"
    done = run(installed, tmp_path, "-c", probe)
    module, conf = done.stdout.split()
    assert "site-packages" in module and str(ROOT) not in module
    assert conf.endswith("grpo_sweeper_conf") and str(ROOT) not in conf


def test_train_sweep_and_tuned_from_an_empty_directory(installed, tmp_path):
    trained = run(installed, tmp_path, "-m", "trainer", "max_steps=1", *TINY)
    assert trained.returncode == 0, trained.stderr[-3000:]
    swept = run(
        installed, tmp_path, "-m", "sweeper", "-m", "lr=1e-3,2e-3", "max_steps=1", *TINY, ONE_SEED
    )
    assert swept.returncode == 0, swept.stderr[-3000:]
    (tuned,) = (tmp_path / "tuned").glob("*.yaml")
    reused = run(installed, tmp_path, "-m", "trainer", f"+tuned={tuned.stem}", "max_steps=1")
    assert reused.returncode == 0, reused.stderr[-3000:]
    presets = run(installed, tmp_path, "-m", "sweeper", "+search=rl", "--cfg", "hydra")
    assert presets.returncode == 0 and "interval(5e-4, 5e-3)" in presets.stdout
    report = run(installed, tmp_path, "-m", "analysis", "best")
    assert report.returncode == 0 and report.stdout == tuned.read_text()


def test_a_users_own_config_in_the_working_directory_joins_the_installed_ones(installed, tmp_path):
    (tmp_path / "task").mkdir()
    (tmp_path / "task" / "small.yaml").write_text(
        "_target_: trainer.env.tasks.AdditionTask\nnum_digits: 1\neval_size: 8\nseed: 0\n"
    )
    shown = run(installed, tmp_path, "-m", "trainer", "task=small", "--cfg", "job")
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "num_digits: 1" in shown.stdout
