"""Each package's map (its `__init__` docstring) against the tree: a map line names a module or
sub-package that exists, and every module and sub-package is named in its own package's map or
an enclosing one's. Two maps once named a module that no longer existed; this keeps them true.

A map line is an indented name, then two or more spaces, then what it holds (`  load   ...`,
`plan/   ...`), as the maps write them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("records", "trainer", "analysis", "sweeper")
MAP_LINE = re.compile(r"^ *(\w+)/? {2,}\S")


def map_lines(docstring: str) -> list[str]:
    return [m.group(1) for line in docstring.splitlines() if (m := MAP_LINE.match(line))]


def docstring(package: Path) -> str:
    return ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""


def children(package: Path) -> set[str]:
    """The modules and sub-packages of a package (its own __init__ and __main__ aside)."""
    modules = {p.stem for p in package.glob("*.py")} - {"__init__", "__main__"}
    return modules | {p.parent.name for p in package.glob("*/__init__.py")}


def subpackages(top: Path) -> list[Path]:
    return sorted(p.parent for p in top.rglob("__init__.py"))


def stale_map_lines(top: Path) -> list[str]:
    """Map lines naming nothing in the package's tree."""
    names = {name for package in subpackages(top) for name in children(package)}
    return [
        f"{package.relative_to(top.parent)}: {name}"
        for package in subpackages(top)
        for name in map_lines(docstring(package))
        if name not in names
    ]


def unnamed(top: Path) -> list[str]:
    """Modules and sub-packages named in neither their package's map nor an enclosing one's."""
    missing = []
    for package in subpackages(top):
        enclosing = [p for p in subpackages(top) if package == p or p in package.parents]
        text = " ".join(docstring(p) for p in enclosing)
        for name in sorted(children(package)):
            if not re.search(rf"\b{name}\b", text):
                missing.append(str((package / name).relative_to(top.parent)))
    return missing


@pytest.mark.parametrize("package", PACKAGES)
def test_every_map_line_names_a_module_that_exists(package):
    assert not stale_map_lines(ROOT / package)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_is_on_a_map(package):
    assert not unnamed(ROOT / package)


def test_the_check_finds_a_stale_line_and_an_unnamed_module(tmp_path):
    top = tmp_path / "pkg"
    (top / "inner").mkdir(parents=True)
    (top / "__init__.py").write_text('"""Map:\n  kept     here\n  outcome  gone\n"""\n')
    (top / "kept.py").write_text("")
    (top / "inner" / "__init__.py").write_text('"""Nothing listed."""\n')
    (top / "inner" / "forecaster.py").write_text("")
    assert stale_map_lines(top) == ["pkg: outcome"]
    assert unnamed(top) == ["pkg/inner", "pkg/inner/forecaster"]
