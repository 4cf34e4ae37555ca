"""Every command shown in README.md and docs/*.md parses in bash as written, so it pastes: a
grammar example like `tag(log, interval(1e-4,1e-2))` is shown quoted inside a full command, a
placeholder is a shell variable ("$STUDY"), not `<study>` (a redirection to bash). The
README's own workflow (its main sweep, a sweep from the tuned file, the analysis commands)
runs as written, in bash, with tiny training settings appended to the two sweeps."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import verdict_decision

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# An inline code span is a command when it starts with one of the project's programs.
PROGRAMS = ("python", "pip", "mlflow", "optuna-dashboard")


def commands(text: str) -> list[str]:
    blocks = re.findall(r"```(?:bash|sh|shell)\n(.*?)```", text, re.S)
    spans = re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text)
    return blocks + [s for s in spans if s.split(" ", 1)[0] in PROGRAMS and " " in s]


def test_the_extractor_finds_blocks_and_command_spans():
    text = "Run `python -m sweeper -m lr=1e-3`, not `lr=1`.\n```bash\npip install -e .\n```\n"
    assert commands(text) == ["pip install -e .\n", "python -m sweeper -m lr=1e-3"]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_command_parses_in_bash(page):
    found = commands(page.read_text())
    broken = []
    for command in found:
        done = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
        if done.returncode:
            broken.append(f"{command.strip()!r}: {done.stderr.strip().splitlines()[0]}")
    assert not broken, "\n".join(broken)


# The README's commands that run here, in the order a reader runs them: what each prints is
# what the next one's variables ($STUDY, ...) are set from.
MAIN_SWEEP = "python -m sweeper -m group_size=4,8 lr=1e-3,2e-3"
TUNED_SWEEP = 'python -m sweeper -m +tuned="$STUDY" kl_penalty_coef=0.01,0.05'
ANALYSIS = [
    "python -m analysis report",
    'python -m analysis best --study "$STUDY"',
    'python -m analysis compare "$STUDY_A" "$STUDY_B"',
]
# Appended to each sweep: a few steps on a few problems, the README's grid unchanged.
TINY = "batch_size=4 max_steps=2 eval_every=0 task.eval_size=16"


def readme_lines() -> set[str]:
    found = commands((ROOT / "README.md").read_text())
    return {line.split("#", 1)[0].strip() for c in found for line in c.splitlines()}


def bash(command: str, cwd: Path, **variables: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}  # the default
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # this `python`
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env={**env, **variables},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{command}: {done.stderr[-3000:]}"
    return done


def study_of(done: subprocess.CompletedProcess) -> str:
    return re.search(r"\[sweep (grpo-[0-9a-f]+)\]", done.stderr).group(1)


@pytest.mark.slow
def test_the_readme_workflow_runs_as_written(tmp_path):
    assert {MAIN_SWEEP, TUNED_SWEEP, *ANALYSIS} <= readme_lines()
    main = bash(f"{MAIN_SWEEP} {TINY}", tmp_path)
    study = study_of(main)
    terminal = main.stderr + main.stdout
    # A third of a screen from start to verdict, no line wider than 120 characters but a link
    # (the MLflow view, and the command that serves it), and no carriage-return bars in a pipe.
    lines = terminal.splitlines()
    assert len(lines) <= 25, terminal
    wide = [line for line in lines if len(line) > 120 and "http" not in line]
    assert all("mlflow ui --backend-store-uri" in line for line in wide), wide
    assert "\r" not in terminal and "Training 2 steps" not in terminal
    assert sum(f"[sweep {study}] t{n} " in terminal for n in range(4)) == 4
    # The verdict opens with its decision, in words, and ends with what to run next; the
    # statistics behind it are for hydra.verbose=true, the report and the study's MLflow run.
    verdict_decision(main.stdout)
    verdict = [line for line in main.stdout.splitlines() if not line.startswith("[")]
    assert any(line.startswith("Next: ") for line in verdict), main.stdout
    assert "Best: t" not in main.stdout and "Seeds raced (seeds=auto" not in main.stdout
    # raced by default: 2 to 3 seeds a configuration, and what the verdict cost against the
    # 3-seed grid a careful paper would run, with this tool's health rules first
    assert "seeds raced: 2 each" in terminal
    runs = re.search(
        r"Cost: [\d,]+ training steps in (\d+) runs, \d+% of the [\d,]+ a 3-seed grid takes"
        r"(, health rules or not| with these health rules)( \([\d,]+ estimated\))?(; \d+% without)?\.",
        main.stdout,
    )
    assert runs and 8 <= int(runs.group(1)) <= 20, main.stdout

    tuned = bash(f"{TUNED_SWEEP} {TINY}", tmp_path, STUDY=study)
    other = study_of(tuned)
    assert other != study and (tmp_path / "tuned" / f"{other}.yaml").exists()

    report, best, compare = (
        bash(command, tmp_path, STUDY=study, STUDY_A=study, STUDY_B=other) for command in ANALYSIS
    )
    assert (tmp_path / "reports" / other / "index.html").exists()  # the latest study
    assert other in report.stdout + report.stderr
    assert best.stdout.startswith("# @package _global_"), best.stdout[:500]
    assert study in compare.stdout and other in compare.stdout
