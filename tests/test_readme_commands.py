"""Every command shown in README.md and docs/*.md parses in bash as written, so it pastes: a
grammar example like `tag(log, interval(1e-4,1e-2))` is shown quoted inside a full command, a
placeholder is a shell variable ("$STUDY"), not `<study>` (a redirection to bash)."""

import re
import subprocess
from pathlib import Path

import pytest

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
