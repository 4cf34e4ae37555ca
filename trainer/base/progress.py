"""Progress bars that stay readable in a terminal and in CI logs alike."""

from __future__ import annotations

import sys

from tqdm import tqdm


def progress(iterable, desc: str, **kwargs) -> tqdm:
    # Redraw often in a terminal; in a log file every few seconds is plenty.
    interval = 0.2 if sys.stderr.isatty() else 5.0
    return tqdm(iterable, desc=desc, mininterval=interval, dynamic_ncols=True, **kwargs)
