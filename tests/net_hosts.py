"""Hosts apart on one machine: each "host" is a network namespace of its own, joined to the
root namespace (where the database server listens) by its own veth link on a private /30.
A link is cut silently by setting its root end down (the host keeps its route: its packets
are dropped, not refused) and healed by setting it up; a host's clock is skewed per process
with libfaketime. Traffic goes only over these links: a namespace has no other route.

Everything made (namespaces, links, addresses) is removed when the block ends, on failure
too, and at exit should the block never end. Needs root and iproute2 (`ip netns`);
`unavailable()` says why not otherwise. The benchmark (bench/bench_chaos.py --hosts) and
tests/test_hosts_apart.py use it.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import ipaddress
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

NET = "10.213.0.0/16"  # private; each use takes a free /24 of it, one /30 per host
LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str | None:
    """Why hosts cannot be made here (None when they can): creating a namespace is tried."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"gsw-probe-{os.getpid()}"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` is not permitted here ({made.stderr.strip()[:200]})"
    ip("netns", "delete", probe, check=False)
    return None


def faketime_missing() -> str | None:
    if not glob.glob(LIBFAKETIME):
        return f"libfaketime is not installed ({LIBFAKETIME}; apt-get install libfaketime)"
    return None


def skewed(seconds: int) -> dict[str, str]:
    """The environment of a process whose wall clock runs `seconds` ahead (behind when
    negative), as a host's whose clock drifted: time(), gettimeofday, clock_gettime and so
    datetime.now() are shifted. The monotonic clock moves with them (only its differences
    mean anything; leaving it alone, libfaketime 0.9.10 fails sleeps in threads: EINVAL)."""
    return {
        "LD_PRELOAD": LIBFAKETIME,
        "FAKETIME": f"{seconds:+d}",
        "FAKETIME_DONT_RESET": "1",  # children inherit the offset, not a clock started anew
    }


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of NET with no address on this machine yet (another run may use one)."""
    used = ip("-o", "-4", "addr", "show").stdout
    for net in ipaddress.ip_network(NET).subnets(new_prefix=24):
        prefix = str(net.network_address).rsplit(".", 1)[0] + "."
        if prefix not in used:
            return net
    raise RuntimeError(f"no free /24 left in {NET}")


class Hosts:
    """n namespaces, host i at `client(i)` reaching the root namespace at `server(i)`."""

    def __init__(self, n: int) -> None:
        self.n, self.tag = n, f"g{os.getpid() % 100000}"
        subnet = _free_subnet()
        self.links = list(subnet.subnets(new_prefix=30))[:n]
        self.made: list[tuple[str, str]] = []  # ("netns" | "link", name), in order made

    def name(self, i: int) -> str:
        return f"{self.tag}h{i}"  # the namespace; its link's ends: <name>r (root), <name>n

    def server(self, i: int) -> str:
        return str(self.links[i].network_address + 1)

    def client(self, i: int) -> str:
        return str(self.links[i].network_address + 2)

    def servers(self) -> list[str]:
        return [self.server(i) for i in range(self.n)]

    def subnet(self) -> str:
        return str(self.links[0].supernet(new_prefix=24))

    def make(self) -> None:
        _remove_orphans()
        for i in range(self.n):
            ns, root, inner = self.name(i), self.name(i) + "r", self.name(i) + "n"
            ip("netns", "add", ns)
            self.made.append(("netns", ns))
            ip("link", "add", root, "type", "veth", "peer", "name", inner)
            self.made.append(("link", root))  # deleting one end deletes the pair
            ip("link", "set", inner, "netns", ns)
            ip("addr", "add", f"{self.server(i)}/30", "dev", root)
            ip("link", "set", root, "up")
            inside = ["netns", "exec", ns, "ip"]
            ip(*inside, "addr", "add", f"{self.client(i)}/30", "dev", inner)
            ip(*inside, "link", "set", inner, "up")
            ip(*inside, "link", "set", "lo", "up")

    def remove(self) -> None:
        for kind, name in reversed(self.made):
            if kind == "link":
                ip("link", "delete", name, check=False)
            else:
                ip("netns", "delete", name, check=False)
        self.made.clear()

    def left_behind(self) -> list[str]:
        """Namespaces or links of these hosts still on the machine (none after `remove`)."""
        names = ip("netns", "list").stdout + ip("-o", "link", "show").stdout
        return [self.name(i) for i in range(self.n) if self.name(i) in names]

    def prefix(self, i: int) -> list[str]:
        """A command run on host i: `[*hosts.prefix(i), python, ...]` (the pid is the
        command's own: `ip netns exec` execs it)."""
        return ["ip", "netns", "exec", self.name(i)]

    def cut(self, i: int) -> None:
        """Host i's link drops every packet (its root end down: the host's own end and route
        stay, so its connections hang, none is refused)."""
        ip("link", "set", self.name(i) + "r", "down")

    def heal(self, i: int) -> None:
        """Host i's link carries again, once both of its ends say they are up: the kernel
        marks a veth's carrier a moment after `ip link set up`, and a connection tried before
        that failed with "network unreachable" on a busy machine. Neighbour entries the cut
        left unresolved are dropped, so the first packet resolves its address afresh."""
        ns, root, inner = self.name(i), self.name(i) + "r", self.name(i) + "n"
        inside = ["netns", "exec", ns, "ip"]
        ip("link", "set", root, "up")
        deadline = time.monotonic() + 30
        while not (
            _carries(ip("-o", "link", "show", root))
            and _carries(ip(*inside, "-o", "link", "show", inner))
        ):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the link of host {i} is not up 30 s after healing it")
            time.sleep(0.01)  # a poll of the link's state, not a wait for it to settle
        ip("neigh", "flush", "dev", root)
        ip(*inside, "neigh", "flush", "dev", inner)


def _carries(shown: subprocess.CompletedProcess) -> bool:
    """Whether `ip -o link show` says the link is up with a carrier."""
    flags = shown.stdout.partition("<")[2].partition(">")[0].split(",")
    return "LOWER_UP" in flags and " state UP " in shown.stdout


def _remove_orphans() -> None:
    """Namespaces (and their links) this module made in a process that is gone: one stopped
    by a signal that skipped its clean-up (SIGKILL). A name carries its maker's pid."""
    for line in ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        tag, _, index = name.partition("h")
        if not (tag[:1] == "g" and tag[1:].isdigit() and index.isdigit()):
            continue
        if any(Path(f"/proc/{pid}").exists() for pid in _pids_with_tag(tag)):
            continue
        ip("link", "delete", name + "r", check=False)
        ip("netns", "delete", name, check=False)


def _pids_with_tag(tag: str) -> list[int]:
    """The live pids whose tag (`g` + pid % 100000) this is."""
    return [
        int(d.name)
        for d in Path("/proc").iterdir()
        if d.name.isdigit() and f"g{int(d.name) % 100000}" == tag
    ]


@contextlib.contextmanager
def hosts_apart(n: int) -> Iterator[Hosts]:
    """n hosts made for the block and removed after it, whatever happens."""
    hosts = Hosts(n)
    atexit.register(hosts.remove)  # a run stopped by SIGTERM's sys.exit still cleans up
    try:
        hosts.make()
        yield hosts
    finally:
        hosts.remove()
        atexit.unregister(hosts.remove)


# Each host's client connections notice a dead link within seconds rather than TCP's minutes:
# keepalives on an idle connection, a bound on unacknowledged data on a busy one. The server
# ends a dead host's sessions the same way (SERVER_KEEPALIVES), so its leases can be taken.
CLIENT_KEEPALIVES = "keepalives=1&keepalives_idle=5&keepalives_interval=2&keepalives_count=3"
CLIENT_KEEPALIVES += "&tcp_user_timeout=15000"
SERVER_KEEPALIVES = ["tcp_keepalives_idle=5", "tcp_keepalives_interval=2"]
SERVER_KEEPALIVES += ["tcp_keepalives_count=3", "tcp_user_timeout=15000"]


def url_from(base_url: str, host: str, database: str) -> str:
    """The server's database `database` as host `host`'s workers reach it: the server's
    address on that host's link, keepalives on. As a Hydra override's value it is quoted
    (`storage='...'`: its query has `=` and `&`)."""
    user_at, rest = base_url.split("@", 1)
    port = rest.rsplit(":", 1)[1].split("/", 1)[0]
    return f"{user_at}@{host}:{port}/{database}?{CLIENT_KEEPALIVES}"
