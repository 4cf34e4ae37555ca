"""The docs cannot drift from the tree: README.md stays a front page (at most 250 lines); every
relative link in README.md and docs/*.md leads to a file that exists and, with a `#section`, to
a heading there; every pointer the code, configs and benchmarks make into the docs
(`(docs/trl.md, "Section")`, `docs/page.md`) names a page and a heading that exist; and
docs/training.md's metrics list names every metric records/metrics.py defines.

The tables the guides quote from the code are checked beside the code they quote:
tests/test_readme_tables.py (hyperparameters, bad input), tests/test_health.py (health rules),
tests/test_trl_backend.py (the TRL mapping).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from records import metrics

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 250

FENCE = re.compile(r"^ {0,3}(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6}) +(.*?) *#* *$")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`[^`]*`")
# A pointer into the docs from code or a record: (README, "Section") or (docs/page.md, 'Section').
POINTER = re.compile(r"\((README|docs/[\w.-]+\.md), [\"']([^\"']+)[\"']\)")
PAGE_NAME = re.compile(r"\bdocs/[\w-]+\.md\b")
SKIPPED_DIRS = {".git", ".venv", "__pycache__", "build", "dist", "multirun", "outputs", "mlruns"}


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(page: Path) -> list[str]:
    return [m.group(2) for line in prose_lines(page.read_text()) if (m := HEADING.match(line))]


def anchors(page: Path) -> set[str]:
    """Every heading's anchor, a repeated one numbered as GitHub numbers it (-1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in headings(page):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(page: Path) -> list[str]:
    """The targets of the page's links that stay in the repository (no scheme, no mail)."""
    targets = []
    for line in prose_lines(page.read_text()):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):
                targets.append(target)
    return targets


def test_the_readme_stays_a_front_page():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines (at most {MAX_README_LINES}): move detail to a page in docs/"
    )


def test_every_relative_link_leads_to_a_file_and_a_heading_that_exist():
    assert len(PAGES) > 2, "no pages in docs/"
    broken = []
    for page in PAGES:
        for target in relative_links(page):
            path, _, fragment = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif fragment and file.suffix == ".md" and fragment not in anchors(file):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def sources() -> list[Path]:
    """The repository's code, configs and records that may point into the docs."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.startswith(".")]
        found += [Path(folder) / f for f in files if f.endswith((".py", ".yaml", ".md"))]
    return found


def test_every_pointer_into_the_docs_names_a_page_and_a_heading_that_exist():
    broken = []
    for source in sources():
        if source == Path(__file__).resolve():  # its docstring shows the forms, not pointers
            continue
        text = source.read_text()
        where = source.relative_to(ROOT)
        for name in PAGE_NAME.findall(text):
            if not (ROOT / name).exists():
                broken.append(f"{where}: {name} (no such page)")
        for page_name, section in POINTER.findall(text):
            page = ROOT / ("README.md" if page_name == "README" else page_name)
            titles = {" ".join(h.split()) for h in headings(page)} if page.exists() else set()
            if " ".join(section.split()) not in titles:
                broken.append(f"{where}: ({page_name}, {section!r}) (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_metrics_list_names_every_metric_records_defines():
    page = (ROOT / "docs" / "training.md").read_text()
    listed = page[page.index("\n## Metrics\n") :]
    names = {v for k, v in vars(metrics).items() if k.isupper() and isinstance(v, str)}
    names |= {metrics.stderr_of(metrics.EVAL_REWARD), metrics.stderr_of(metrics.EVAL_GREEDY)}
    part = metrics.eval_reward_part("<name>")
    names |= {metrics.reward_part("<name>"), part, metrics.stderr_of(part)}
    missing = sorted(name for name in names if f"`{name}`" not in listed)
    assert not missing, f"docs/training.md's Metrics section does not name {missing}"
