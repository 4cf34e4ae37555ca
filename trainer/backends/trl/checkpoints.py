"""TRL's checkpoints in a run's output_dir, in our steps: what `resume=true` continues from.

TRL saves `output_dir/checkpoint-<global_step>/` (optimizer steps: num_substeps a step of
ours), its trainer_state.json written once the folder holds everything. No TRL import, so the
sweep job reads it cheaply.
"""

from __future__ import annotations

from pathlib import Path

PREFIX = "checkpoint-"  # transformers' PREFIX_CHECKPOINT_DIR
COMPLETE = "trainer_state.json"


def latest(output_dir: str | Path) -> Path | None:
    """The last complete checkpoint folder, else None."""
    found = [
        path
        for path in Path(output_dir).glob(f"{PREFIX}*")
        if path.name.removeprefix(PREFIX).isdigit() and (path / COMPLETE).is_file()
    ]
    return max(found, key=global_step) if found else None


def global_step(path: Path) -> int:
    return int(path.name.removeprefix(PREFIX))


def resumed_from_step(cfg) -> int | None:
    """The step of ours a `resume=true` run continues from (None: a fresh start)."""
    checkpoint = latest(cfg.output_dir) if cfg.resume else None
    return None if checkpoint is None else global_step(checkpoint) // cfg.num_substeps
