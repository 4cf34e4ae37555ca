"""Helpers shared by the tests: composing the real conf/, recording a run's metrics, a free
local port, running a sweep in a folder of its own, and a policy's adapter and log-probs.
Fixtures, so each test gets its own copy pointed at its own tmp_path.

Test files are named by what they pin: a module's own rules by its name (test_losses.py,
test_cpu_linear.py), a behaviour across modules by the behaviour (test_preemption.py,
test_scale_out.py, test_racing_sweeps.py); each test function says the behaviour it checks."""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

import analysis.sweep_job  # noqa: F401  (registers the sweep job's schema, for `sweep`)
import trainer  # noqa: F401  (registers the config schemas before composing)
from trainer.model import cpu_threads
from trainer.model.fast_logprobs import token_logprobs
from trainer.model.token_batch import collate
from trainer.rl import rl_math

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
# A race test whose overlap is forced by state (a barrier before schema creation) overlaps in
# every round, so one round tests it; GRPO_SWEEPER_RACE_ROUNDS=N repeats each N times
# (docs/contributing.md: before a release, or after touching store creation).
RACE_ROUNDS = int(os.environ.get("GRPO_SWEEPER_RACE_ROUNDS", "1"))


def pytest_configure(config: pytest.Config) -> None:
    """Each test worker computes on its share of the cores, and so do the runs it starts
    (pytest-xdist's workers run side by side, as a sweep's lanes do: trainer/model/
    cpu_threads.py), not on every core each."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault(cpu_threads.RUNS_AT_ONCE, str(workers))
    torch.set_num_threads(max(1, cpu_threads.usable_cores() // workers))


def compose_conf(
    *overrides: str, config_name: str = "config", hydra_node: bool = False
) -> DictConfig:
    """A config of the real conf/, composed as the CLI would (no output_dir set)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name, overrides=list(overrides), return_hydra_config=hydra_node)


@pytest.fixture
def composed(tmp_path: Path) -> Callable[..., DictConfig]:
    """composed(*overrides, root=tmp_path): the training config, writing under root/run."""

    def make(*overrides: str, root: Path | None = None) -> DictConfig:
        return compose_conf(f"output_dir={root or tmp_path}/run", *overrides)

    return make


class Recorder:
    """A trainer reporter that keeps every step's metrics."""

    def __init__(self) -> None:
        self.steps: dict[int, dict[str, float]] = {}
        self.decided: dict[str, str] = {}  # what the run decided as its policy loaded

    def report(self, step: int, metrics) -> None:
        self.steps[step] = dict(metrics)

    def params(self, params) -> None:
        self.decided.update(params)

    def series(self, name: str) -> dict[int, float]:
        return {s: m[name] for s, m in self.steps.items() if name in m}


@pytest.fixture
def new_recorder() -> Callable[[], Recorder]:
    """new_recorder(): a fresh Recorder (a test comparing runs takes several)."""
    return Recorder


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face directory (tests/real_model.py builds it once).
    Tests that take it are marked `real_model`."""
    from real_model import smollm2_dir

    return smollm2_dir()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def port() -> int:
    return free_port()


def mlflow_uri(cwd: Path) -> str:
    """The MLflow store a test's sweep in cwd writes (its own SQLite file there)."""
    return f"sqlite:///{cwd}/mlflow.db"


def study_uri(cwd: Path) -> str:
    """The sweeper's default study storage for a sweep started in cwd."""
    return f"sqlite:///{cwd}/sweeps.db"


def sweep_env(cwd: Path, store: bool = True) -> dict[str, str]:
    """The environment of a sweep in cwd: its own MLflow store there. store: the store is
    placed first, already migrated (`placed_store`); False: the sweep makes it, as a
    newcomer's first sweep does."""
    if store:
        placed_store(cwd)
    return {**os.environ, "MLFLOW_TRACKING_URI": mlflow_uri(cwd)}


_STORE_TEMPLATE: list[Path] = []  # this test process's migrated store, made on first use


def placed_store(cwd: Path) -> None:
    """An empty MLflow store at cwd/mlflow.db, unless one is there: a copy of one made once
    per test process by the sweep's own code (records/tracking_store.py). A sweep then opens it in
    0.71 s instead of making one in 1.33 s (this 2-core host, three rounds); making a store
    has tests of its own (test_sqlite_store_race.py, test_concurrent_start.py, test_wheel.py,
    and every test whose sweep passes store=False)."""
    target = cwd / "mlflow.db"
    if target.exists():
        return
    if not _STORE_TEMPLATE:
        from records.tracking_store import tracking_client

        folder = Path(tempfile.mkdtemp(prefix="mlflow-template-"))
        atexit.register(shutil.rmtree, folder, True)
        tracking_client(mlflow_uri(folder)).search_experiments(max_results=1)
        _STORE_TEMPLATE.append(folder / "mlflow.db")
    shutil.copyfile(_STORE_TEMPLATE[0], target)


ONE_SEED = "hydra.sweeper.seeds=1"


def one_seed_unless_named(args: Sequence[str]) -> list[str]:
    """args with ONE_SEED added unless they name the seeds: a test that counts trials, runs or
    steps pins the plain one-run grid it was written for; the default (seeds=auto, racing) has
    tests of its own (test_racing_sweeps.py, the README's command in test_readme_commands.py)."""
    named = any(a.startswith("hydra.sweeper.seeds=") for a in args)
    return [*args] if named else [*args, ONE_SEED]


# How a verdict's first line, its decision, starts (analysis/verdict.py): tied, not decided,
# nothing learned, too few seeds to tell, every run broke, one completed, or a winner
# ("t2 (lr=0.001) beat every other ...").
DECISIONS = (
    "Tied at this sample size",
    "Not decided",
    "Nothing learned",
    "Too few seeds to tell",
    "Every run broke",
    "Only t",
    "t",
)


def verdict_decision(stdout: str) -> str:
    """The verdict's first line in a sweep's stdout (the lines before it are Hydra's logs)."""
    verdict = [line for line in stdout.splitlines() if line and not line.startswith("[")]
    assert verdict and verdict[0].startswith(DECISIONS), stdout[-3000:]
    return verdict[0]


def run_sweep(
    cwd: Path, *args: str, timeout: int = 600, store: bool = True, **popen
) -> subprocess.CompletedProcess:
    """`python -m sweeper -m <args>` in cwd (one seed unless args name the seeds), with its own
    MLflow store there (popen's env, when given, replaces sweep_env(cwd, store))."""
    if "env" not in popen:  # not setdefault: sweep_env places a store in cwd
        popen["env"] = sweep_env(cwd, store)
    return subprocess.run(
        [sys.executable, "-m", "sweeper", "-m", *one_seed_unless_named(args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        **popen,
    )


# A small raced sweep the MLflow pages' tests share (test_mlflow_ui.py, test_mlflow_links.py).
RUNS_SWEEP = (
    "lr=1e-3,2e-3", "max_steps=2", "eval_every=2", "batch_size=4", "group_size=2",
    "hydra.sweeper.seeds=2",
)  # fmt: skip


@dataclass(frozen=True)
class Swept:
    """A finished sweep: its folder (its stores are there) and what it printed."""

    cwd: Path
    stdout: str
    stderr: str


@pytest.fixture(scope="session")
def shared_sweep(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Swept]:
    """shared_sweep(*args): `python -m sweeper -m <args>` as run_sweep runs it, once for the whole
    session, keyed by its arguments: the first test to ask (in any file, on either pytest-xdist
    worker) runs it under a file lock, the others read the same folder. It must succeed. A test
    may add to it only what the others ignore (a report, a view); it changes nothing there."""
    base = tmp_path_factory.getbasetemp()
    # xdist's workers each have a folder of their own inside the session's: share that one
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-sweeps"
    root.mkdir(exist_ok=True)

    def get(*args: str, timeout: int = 600) -> Swept:
        from filelock import FileLock

        cwd = root / hashlib.sha256("\0".join(args).encode()).hexdigest()[:16]
        record = cwd.with_suffix(".json")
        with FileLock(str(cwd.with_suffix(".lock"))):
            if not record.exists():
                shutil.rmtree(cwd, ignore_errors=True)
                cwd.mkdir()
                done = run_sweep(cwd, *args, timeout=timeout)
                assert done.returncode == 0, done.stderr[-3000:]
                record.write_text(json.dumps({"args": args, "out": [done.stdout, done.stderr]}))
        stdout, stderr = json.loads(record.read_text())["out"]
        return Swept(cwd, stdout, stderr)

    return get


def start_sweep(cwd: Path, *args: str, **popen) -> subprocess.Popen:
    """`python -m sweeper -m <args>` started in cwd (one seed unless args name the seeds) with
    its own MLflow store, not awaited; its output as text, to wherever popen's stdout and stderr
    send it."""
    command = [sys.executable, "-m", "sweeper", "-m", *one_seed_unless_named(args)]
    return subprocess.Popen(command, cwd=cwd, env=sweep_env(cwd), text=True, **popen)


def study_in(cwd: Path) -> optuna.Study:
    """The one study a sweep in cwd created in its default SQLite storage."""
    storage = study_uri(cwd)
    (name,) = optuna.get_all_study_names(storage)
    return optuna.load_study(study_name=name, storage=storage)


PROMPTS = ["12+34=", "7+45=", "99+1=", "3+3="]


def moved_adapter(policy, seed: int = 0) -> None:
    """A trained-looking adapter: LoRA B starts at zero, which would hide a wrong merge."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))


def learner_kl(policy, rollouts, temperature: float = 1.0) -> float:
    """The sampler's log-probs against the learner's, as the training step computes them."""
    batch = collate(rollouts, policy.tokenizer.pad_token_id)
    with policy.learner() as model:
        learner_NT, _ = token_logprobs(model, batch, temperature)
    return rl_math.kl_sample_train(batch.sampler_logp_NT, learner_NT.detach(), batch.mask_NT)[1]


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="needs headless Chromium (apt-get install chromium), as .ci/run does"
)


needs_trl = pytest.mark.skipif(
    importlib.util.find_spec("trl") is None,
    reason="backend=trl needs the trl extra (.[trl], Python >= 3.11)",
)


def rendered_dom(url: str, profile: Path, budget_ms: int, timeout_s: int, *flags: str) -> str:
    """The page at url as headless Chromium leaves it after budget_ms of virtual time (its
    scripts run, its images load): what a user's browser shows, as HTML."""
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run",
        f"--user-data-dir={profile}", *flags, f"--virtual-time-budget={budget_ms}", "--dump-dom",
        url,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=True)
    return done.stdout


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with the longest tests first. `-n 2 --dist loadfile` (pyproject's addopts) hands a
    worker the next file when it is free, in this order: long files start early and short ones
    fill the end, instead of one worker running a long file alone at the end (minutes of CI).
    Longest: the most real-model tests, then the most slow ones; each file's order is kept."""
    weight: dict[str, list[int]] = {}
    for item in items:
        marks = {mark.name for mark in item.iter_markers()}
        counts = weight.setdefault(item.nodeid.split("::")[0], [0, 0])
        counts[0] -= "real_model" in marks
        counts[1] -= "slow" in marks
    items.sort(key=lambda item: weight[item.nodeid.split("::")[0]])  # stable
