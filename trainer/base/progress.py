"""Progress bars that stay readable in a terminal and in CI logs alike."""

from __future__ import annotations

import sys

from tqdm import tqdm

from records import metrics as metrics_names


def progress(iterable, desc: str, **kwargs) -> tqdm:
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
