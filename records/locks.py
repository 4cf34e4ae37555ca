"""Inter-process locks for the local files several workers share (SQLite stores).

flock(2) locks are released by the kernel when a process dies, so a kill -9 never leaves a
lock held; Linux keeps them apart from the fcntl byte-range locks SQLite itself uses.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def flocked(path: str | Path) -> Iterator[None]:
    """Hold an exclusive flock on an existing file or directory for the block."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
