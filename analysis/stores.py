"""The stores a sweep writes, opened so that they outlast a restart or a failover: Optuna's
RDB storage with every call retried while the database is unreachable (trainer/run/database.py).
The sweep writes through it (sweeper/study/storage.py adds its writes' keys), the analysis
reads through it: a report on a busy or restarting store waits as a trial does."""

from __future__ import annotations

from typing import Any

from optuna.storages import BaseStorage, RDBStorage

from trainer.run.database import retrying, shown_url


class ResilientRDBStorage(RDBStorage):
    """Optuna's RDB storage, each call retried while the database is unreachable; `store`
    names it in messages."""

    def __init__(self, url: str, *args: Any, store: str | None = None, **kwargs: Any) -> None:
        self.store = store or f"the Optuna storage {shown_url(url)!r}"
        super().__init__(url, *args, **kwargs)


# Every call that reaches the database: BaseStorage's API, the heartbeats, and the private
# methods Optuna's _CachedStorage (which load_study puts in front of an RDB storage) calls on
# its backend directly.
for _name in [n for n in vars(BaseStorage) if not n.startswith("_")] + [
    "record_heartbeat",
    "_get_stale_trial_ids",
    "_create_new_trial",
    "_set_trial_param",
    "_get_best_trial_id",
    "_get_trials",
]:
    if callable(getattr(RDBStorage, _name)):
        method = getattr(RDBStorage, _name)
        setattr(ResilientRDBStorage, _name, retrying(method, lambda self: self.store))
