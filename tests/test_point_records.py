"""Comparing a run's points with a fault-free reference (tests/point_records.py `compared`), on
hand-made records, and the hosts of tests/net_hosts.py: a cut link drops (a connection
times out, none is refused), a healed one carries again, nothing is left behind."""

from __future__ import annotations

import math
import socket
import subprocess
import sys

import pytest
from net_hosts import hosts_apart, unavailable
from point_records import compared


def point(value, curve, state="COMPLETE", resumed=None):
    return {
        "state": state,
        "value": value,
        "steps_run": max(curve),
        "resumed_from_step": resumed,
        "curves": {"reward/mean": curve},
    }


REFERENCE = {"lr=0.001": point(0.5, {1: 0.25, 2: 0.5}), "lr=0.002": point(0.25, {1: 0.0, 2: 0.25})}


def test_a_run_equal_to_its_reference_has_no_difference():
    same = compared(REFERENCE, {**REFERENCE, "lr=0.002": point(0.25, {1: 0.0, 2: 0.25}, resumed=1)})
    assert same["differences"] == [] and same["largest_difference"] == 0.0
    assert same["resumed_points"] == 1 and same["points"] == 2


def test_each_difference_is_named_and_a_tolerance_admits_the_small_ones():
    chaotic = {
        "lr=0.001": point(0.5, {1: 0.25, 2: 0.5 + 1e-7}),  # a step off by 1e-7
        "lr=0.002": point(None, {1: 0.0}, state="PRUNED"),  # pruned a step early
    }
    exact = compared(REFERENCE, chaotic)
    assert exact["differences"] == [
        "lr=0.001 reward/mean step 2: 0.5000001, the reference 0.5",
        "lr=0.002: ended PRUNED after 1 steps, the reference COMPLETE after 2",
        "lr=0.002 reward/mean: steps [2] in one run only",
        "lr=0.002 value: None, the reference 0.25",
    ]
    assert exact["largest_difference"] == math.inf  # a value against none
    loose = compared(REFERENCE, {**REFERENCE, "lr=0.001": chaotic["lr=0.001"]}, tolerance=1e-6)
    assert loose["differences"] == [] and loose["largest_difference"] == pytest.approx(1e-7)


def test_a_point_missing_from_either_run_is_a_difference():
    same = compared(REFERENCE, {"lr=0.001": REFERENCE["lr=0.001"]})
    assert same["differences"] == ["lr=0.002: only in the reference run"]


@pytest.mark.slow
def test_a_cut_link_drops_packets_and_a_healed_one_carries_them():
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    connect = (
        "import socket, sys\n"
        "try:\n"
        "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()\n"
        "    print('connected')\n"
        "except OSError as e:\n"
        "    print(type(e).__name__)\n"
    )
    with hosts_apart(1) as hosts, socket.create_server((hosts.server(0), 0)) as listener:
        port = str(listener.getsockname()[1])

        def from_the_host() -> str:
            command = [*hosts.prefix(0), sys.executable, "-c", connect, hosts.server(0), port]
            return subprocess.run(command, capture_output=True, text=True, timeout=60).stdout

        assert from_the_host().strip() == "connected"
        hosts.cut(0)
        assert from_the_host().strip() == "TimeoutError"  # dropped, not refused
        hosts.heal(0)
        assert from_the_host().strip() == "connected"
    assert hosts.left_behind() == []
