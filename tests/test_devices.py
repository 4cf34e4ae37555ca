"""One trial per GPU, checked without a GPU: concurrent runs lease distinct devices from the
pool and give them back when they end; a pool too small for the runs at once is refused."""

from __future__ import annotations

import threading
import time

import pytest

from sweeper import SweepError
from sweeper.sweep.devices import DevicePool


def test_concurrent_runs_get_distinct_devices_and_return_them():
    pool = DevicePool.from_setting([0, 1], runs_at_once=2)
    assert pool.devices == ["cuda:0", "cuda:1"]
    held: list[str] = []
    overlap = threading.Barrier(2)

    def run() -> None:
        with pool.lease() as device:
            held.append(device)
            overlap.wait(timeout=5)  # both leases are held at the same moment

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(held) == ["cuda:0", "cuda:1"]
    with pool.lease() as a, pool.lease() as b:  # both came back
        assert {a, b} == {"cuda:0", "cuda:1"}


def test_a_third_run_waits_for_a_freed_device():
    pool = DevicePool.from_setting(["cuda:3"], runs_at_once=1)
    order: list[str] = []
    with pool.lease():
        waiter = _waiting_run(pool, order, "second")
        order.append("first done")
    waiter.join(timeout=5)
    assert order == ["first done", "second got cuda:3"]


def _waiting_run(pool: DevicePool, order: list[str], name: str) -> threading.Thread:
    """A run in a thread that leases (waiting while the pool is taken), noting what it got."""

    def run() -> None:
        with pool.lease() as device:
            order.append(f"{name} got {device}")

    waiter = threading.Thread(target=run)
    waiter.start()
    time.sleep(0.2)  # it is waiting now
    return waiter


def test_no_pool_leaves_the_config_device_alone():
    with DevicePool.from_setting(None, runs_at_once=4).lease() as device:
        assert device is None


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ([0, 0], "a device is listed twice"),
        (["cuda:0"], "2 runs at once (hydra.sweeper.n_jobs) need at least 2 devices"),
    ],
)
def test_bad_pools_fail_in_one_line(setting, message):
    with pytest.raises(SweepError, match=message.replace("(", r"\(").replace(")", r"\)")):
        DevicePool.from_setting(setting, runs_at_once=2)


def test_a_run_over_two_processes_takes_two_devices_at_once():
    """backend.processes=2: each of n_jobs=2 runs leases two devices; a third waits until a
    run gives its two back, and never holds one while waiting for the other."""
    pool = DevicePool.from_setting([0, 1, 2, 3], runs_at_once=2, per_run=2)
    order: list[str] = []
    with pool.lease() as a:
        with pool.lease() as b:
            assert (a, b) == ("cuda:0,cuda:1", "cuda:2,cuda:3")
            waiter = _waiting_run(pool, order, "third")
            order.append("second done")
        waiter.join(timeout=5)
        assert order == ["second done", "third got cuda:2,cuda:3"]
        assert pool._free == ["cuda:2", "cuda:3"]  # the third gave its two back


def test_a_pool_too_small_for_the_runs_processes_is_refused():
    with pytest.raises(SweepError, match=r"of 2 processes \(backend.processes\) need at least 4"):
        DevicePool.from_setting([0, 1, 2], runs_at_once=2, per_run=2)
