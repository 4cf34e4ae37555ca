"""The pages people read stay short to read: README.md and every docs/*.md keep a mean sentence
of at most 22 words and no sentence over 50; every bench/*.md stays at most 400 lines (the
current figures and the command that reproduces each; the history is in git).

How a page is split into sentences (`sentences`, a pure function):
- prose only: fenced code blocks, tables (`|` lines), headings and HTML comments are left out;
- paragraphs end at a blank line, and every list item (`-`, `*`, `+`, `1.`) ends a sentence;
- a sentence ends at `.`, `!` or `?` followed by a space and a word that does not start in lower
  case (so "e.g. the" and "1.3 MB" do not end one);
- a word is a run of non-space characters holding a letter or digit; an inline code span counts
  as one word, and a link counts by its text.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_docs import PAGES, ROOT, prose_lines

MAX_MEAN_WORDS = 22
MAX_SENTENCE_WORDS = 50
MAX_BENCH_LINES = 400

TABLE_ROW = re.compile(r"^ {0,3}\|")
HEADING_LINE = re.compile(r"^ {0,3}#{1,6} ")
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
QUOTE = re.compile(r"^\s*>\s?")
COMMENT = re.compile(r"<!--.*?-->", re.S)
CODE_SPAN = re.compile(r"`[^`]+`")
LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
SENTENCE_END = re.compile(r"(?<=[.!?])[)\"'*_]*\s+(?=[^a-z\s])")
WORD = re.compile(r"\S*[A-Za-z0-9]\S*")


def blocks(text: str) -> list[str]:
    """The page's prose as blocks, each a paragraph or one list item, lines joined by spaces."""
    found: list[list[str]] = []
    current: list[str] = []
    for line in prose_lines(COMMENT.sub("", text)):
        line = QUOTE.sub("", line)
        if not line.strip() or TABLE_ROW.match(line) or HEADING_LINE.match(line):
            current = []
            continue
        if LIST_ITEM.match(line) or not current:
            current = []
            found.append(current)
        current.append(LIST_ITEM.sub("", line, count=1).strip())
    return [" ".join(block) for block in found]


def sentences(text: str) -> list[tuple[str, int]]:
    """Each prose sentence of a Markdown page with its number of words, in page order."""
    found = []
    for block in blocks(text):
        block = LINK.sub(r"\1", CODE_SPAN.sub("CODE", block))
        for sentence in SENTENCE_END.split(block):
            words = len(WORD.findall(sentence))
            if words:
                found.append((sentence.strip(), words))
    return found


def test_the_splitter_counts_sentences_and_words_by_hand():
    text = """# A heading is not a sentence

Run `python -m sweeper -m lr=1e-3` first. It takes 1.3 s, e.g. on a laptop!
See [the health rules](docs/health.md) before you tune.

| a table | is left out |
|---|---|

- one item, no full stop
- two. Three words here

```bash
echo code is left out. So is this
```
"""
    assert [n for _, n in sentences(text)] == [3, 8, 7, 5, 1, 3]


def test_a_list_item_runs_on_over_its_indented_lines():
    text = "1. First item\n   goes on here. Then\n   a second.\n2) Next?\n> Quoted text. Yes."
    assert [n for _, n in sentences(text)] == [5, 3, 1, 2, 1]


def pages_with_long_sentences() -> list[str]:
    problems = []
    for page in PAGES:
        found = sentences(page.read_text())
        name = page.relative_to(ROOT)
        mean = sum(n for _, n in found) / max(len(found), 1)
        if mean > MAX_MEAN_WORDS:
            problems.append(f"{name}: mean sentence {mean:.1f} words (at most {MAX_MEAN_WORDS})")
        for sentence, words in found:
            if words > MAX_SENTENCE_WORDS:
                start = " ".join(sentence.split()[:8])
                problems.append(f'{name}: "{start} ..." has {words} words')
    return problems


def test_every_page_keeps_its_sentences_short():
    problems = pages_with_long_sentences()
    assert not problems, "split these sentences:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", sorted((ROOT / "bench").glob("*.md")), ids=lambda p: p.name)
def test_every_bench_page_stays_short(page: Path):
    lines = len(page.read_text().splitlines())
    assert lines <= MAX_BENCH_LINES, (
        f"{page.relative_to(ROOT)} has {lines} lines (at most {MAX_BENCH_LINES}): keep the current "
        "figures and the command that reproduces each; the history is in git"
    )
