"""The guides' tables against the code they describe, so neither drifts: in docs/training.md
the hyperparameter table's defaults are TrainConfig's, every root hyperparameter has a row, and
the losses line quotes the clip values LossConfig and conf/loss/dapo.yaml set; in
docs/sweeping.md every bad-input test row has a row a user can read (tests/test_health.py does
the same for docs/health.md's table, tests/test_trl_backend.py for docs/trl.md's mapping).
These tables lived in the README before it became a front page; tests/test_docs.py checks the
links between the pages.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import yaml
from test_bad_input import ROWS

from records.tracking import BOOKKEEPING_KEYS
from trainer.base.config import LossConfig, TrainConfig
from trainer.run.validation import loss_preset

DOCS = Path(__file__).resolve().parents[1] / "docs"
GROUPS = ("model", "task", "loss", "sampler", "backend")  # config groups: a section each


def section(page: str, title: str) -> str:
    """The `## title` section of docs/<page>, up to the next `## ` heading."""
    text = (DOCS / page).read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def hyperparameter_rows() -> dict[str, str]:
    """{key: its default as docs/training.md prints it}, one per key of a row's first column."""
    table = {}
    for line in section("training.md", "Hyperparameters").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        keys = re.findall(r"`([^`]+)`", cells[0])
        defaults = re.split(r",\s*(?![^\[]*\])", cells[1])
        assert len(keys) == len(defaults), (
            f"row {line!r}: {len(keys)} keys, {len(defaults)} defaults"
        )
        table.update(zip(keys, defaults, strict=True))
    return table


def printed(value: object) -> object:
    """A default as docs/training.md prints it, read back: `2e-3` a number, `[all-linear]` a list."""
    text = re.sub(r"\s*\(.*\)$", "", str(value))  # "0 (= batch_size)" -> "0"
    loaded = yaml.safe_load(text)
    try:
        return float(loaded) if isinstance(loaded, str) else loaded
    except ValueError:
        return loaded


def schema_default(key: str) -> object:
    node: object = TrainConfig()
    for part in key.split("."):
        node = getattr(node, part)
    return node


def test_each_hyperparameter_row_quotes_the_schema_default():
    for key, shown in hyperparameter_rows().items():
        default = schema_default(key)
        expected = (
            float(default)
            if isinstance(default, int | float) and not isinstance(default, bool)
            else default
        )
        got = printed(shown)
        got = float(got) if isinstance(got, int | float) and not isinstance(got, bool) else got
        assert got == expected, (
            f"docs/training.md says {key} defaults to {shown}; TrainConfig says {default!r}"
        )


def test_every_root_hyperparameter_has_a_row():
    rows = hyperparameter_rows()
    not_hyperparameters = {*GROUPS, *BOOKKEEPING_KEYS}
    missing = [
        f.name
        for f in dataclasses.fields(TrainConfig)
        if f.name not in not_hyperparameters and f.name not in rows
    ]
    assert not missing, f"docs/training.md's hyperparameter table lacks {missing}"


def test_the_losses_line_quotes_the_clip_values():
    text = " ".join(section("training.md", "Hyperparameters").split())
    assert f"clipped ratio, {LossConfig.clip_low:g}/{LossConfig.clip_high:g}" in text
    assert f"clip-higher {loss_preset('dapo')['loss.clip_high']:g}" in text


def test_every_bad_input_test_has_a_row_in_the_sweeping_guide():
    table = section("sweeping.md", "Bad input")
    shown = {
        "BLANK_PROMPT_JSONL": "qa.jsonl",
        "BLANK_ANSWER_CSV": "qa.csv",
        "BAD_JSONL": "bad.jsonl",
        "QA_JSONL": "qa.jsonl",
        "CHAT_JSONL": "chat.jsonl",
        "EMPTY_DIR": "empty/",
        "CONFIG_ONLY_DIR": "m/",
        "CUT_WEIGHTS_DIR": "m/",
        "NO_TOKENIZER_DIR": "m/",
        "TINY_DIR": "m/",
    }
    for _, _, message in ROWS:
        for placeholder, name in shown.items():
            message = message.replace(placeholder, name)
        # The row may shorten what follows a URL or a path; its start names the parameter.
        start = re.split(r"'[a-z0-9+]+://", message)[0][:60]
        assert start in table, f"no bad-input row of docs/sweeping.md shows {start!r}"
