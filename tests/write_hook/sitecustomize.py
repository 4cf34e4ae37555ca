"""Tests only, imported at start-up by a process whose PYTHONPATH begins with this folder.

HOLD_WRITE_ENV="<marker file>:<n>:<seconds>": the n-th SQL statement that inserts MLflow
metrics is held open for that long, its transaction (and SQLite's write lock) held, after
touching the marker file: a test then sends a signal that lands inside the write. The real
MLflow store and the real SQLite file do the rest.
"""

import os

HOLD_WRITE_ENV = "GRPO_SWEEPER_TEST_HOLD_WRITE"

if os.environ.get(HOLD_WRITE_ENV):
    import time
    from pathlib import Path

    import sqlalchemy.event
    from sqlalchemy.engine import Engine

    _marker, _nth, _hold_s = os.environ[HOLD_WRITE_ENV].rsplit(":", 2)
    _seen = [0]

    @sqlalchemy.event.listens_for(Engine, "after_cursor_execute")
    def _hold(conn, cursor, statement, parameters, context, executemany) -> None:
        if not statement.lstrip().upper().startswith("INSERT INTO METRICS"):
            return
        _seen[0] += 1
        if _seen[0] != int(_nth):
            return
        Path(_marker).touch()
        deadline = time.monotonic() + float(_hold_s)
        while time.monotonic() < deadline:  # in short sleeps: a signal's handler runs at once
            time.sleep(0.02)
