"""Progress bars that stay readable in a terminal and in CI logs alike."""

from __future__ import annotations

import logging
import sys

from tqdm import tqdm

from records import metrics as metrics_names

log = logging.getLogger(__name__)
_to_log = False  # bars_to_log() was called: bars are INFO lines, not the terminal's


def bars_to_log() -> None:
    """From now on, this process's bars are INFO log lines (a sweep trial's go to its log
    file; the sweep draws its own line per trial on the terminal)."""
    global _to_log
    _to_log = True


class _LogLines:
    """tqdm's output as log lines: each redraw one line, without carriage returns."""

    def write(self, text: str) -> None:
        if text := text.strip("\r\n "):
            log.info(text)

    def flush(self) -> None:
        pass


def progress(iterable, desc: str, **kwargs) -> tqdm:
    if _to_log:
        return tqdm(iterable, desc=desc, mininterval=5.0, ncols=100, file=_LogLines(), **kwargs)
    # Redraw often in a terminal; in a log file every few seconds is plenty.
    interval = 0.2 if sys.stderr.isatty() else 5.0
    return tqdm(iterable, desc=desc, mininterval=interval, dynamic_ncols=True, **kwargs)


def shown_kl(metrics: dict[str, float]) -> dict[str, str]:
    """The progress bar's KL: the post-update KL the health rules read, else the sampler-vs-
    learner KL (compute_post_kl=false), never a KL that was not measured."""
    for name, label in (
        (metrics_names.KL_PRE_POST_V2, "kl"),
        (metrics_names.KL_SAMPLE_TRAIN_V2, "kl_sample"),
    ):
        if name in metrics:
            return {label: f"{metrics[name]:.1e}"}
    return {}
