"""External test hosts: a network namespace joined to this one by a veth pair, with a non-private address.

The proxy classifies a peer by its source address; an external client must come from an address outside
every internal CIDR. ``ExternalHost`` makes such a host (198.18.0.0/15, the benchmarking range, which no
internal CIDR covers) and hands out TCP sockets created *inside* it (a factory process in the namespace sends
them back over SCM_RIGHTS), so a test connects them like any socket and the proxy sees the external address.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import socket
import subprocess
import sys

import pytest

_counter = itertools.count()

FACTORY = r"""
import socket, sys
ctl = socket.socket(fileno=int(sys.argv[1]))
while True:
    req = ctl.recv(16)
    if not req:
        break
    family = socket.AF_INET6 if req == b"6" else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    socket.send_fds(ctl, [b"s"], [s.fileno()])
    s.close()
"""


def available() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


class ExternalHost:
    def __init__(self) -> None:
        if not available():
            pytest.skip("external hosts need root and iproute2 (ip netns)")
        tag = f"{os.getpid():x}{next(_counter)}"
        self.ns = f"s8x{tag}"
        self.veth_host, self.veth_ns = f"s8h{tag}"[:15], f"s8n{tag}"[:15]
        for _attempt in range(20):
            n = random.randrange(1, 1 << 13)
            base = (198 << 24) | (18 << 16) | (n << 2)  # a /30 inside 198.18.0.0/15
            self.gateway_ip = socket.inet_ntoa((base + 1).to_bytes(4, "big"))
            self.client_ip = socket.inet_ntoa((base + 2).to_bytes(4, "big"))
            if self._create():
                break
            self._destroy()
        else:
            raise RuntimeError("could not create a test network namespace")
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._ctl = parent
        self._factory = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, sys.executable, "-c", FACTORY, str(child.fileno())],
            pass_fds=[child.fileno()],
        )
        child.close()

    def _create(self) -> bool:
        # The link's /30 is claimed with an explicit ``route add``, which refuses a prefix another host already
        # routes (an address's automatic prefix route would be appended beside it instead: two hosts that drew
        # the same /30 would both come up, and one's replies would leave through the other's veth).
        network = socket.inet_ntoa((int.from_bytes(socket.inet_aton(self.gateway_ip), "big") - 1).to_bytes(4, "big"))
        steps = [
            ("netns", "add", self.ns),
            ("link", "add", self.veth_host, "type", "veth", "peer", "name", self.veth_ns),
            ("link", "set", self.veth_ns, "netns", self.ns),
            ("addr", "add", f"{self.gateway_ip}/30", "dev", self.veth_host, "noprefixroute"),
            ("link", "set", self.veth_host, "up"),
            ("route", "add", f"{network}/30", "dev", self.veth_host, "src", self.gateway_ip),
            ("-n", self.ns, "addr", "add", f"{self.client_ip}/30", "dev", self.veth_ns),
            ("-n", self.ns, "link", "set", self.veth_ns, "up"),
            ("-n", self.ns, "link", "set", "lo", "up"),
            ("-n", self.ns, "route", "add", "default", "via", self.gateway_ip),
        ]
        return all(_ip(*step).returncode == 0 for step in steps)  # stops at the first failing step

    def _destroy(self) -> None:
        _ip("link", "del", self.veth_host)
        _ip("netns", "del", self.ns)

    def socket(self) -> socket.socket:
        """A fresh, unconnected TCP socket that lives in the external host."""
        self._ctl.send(b"4")
        _, fds, _, _ = socket.recv_fds(self._ctl, 16, 1)
        return socket.socket(fileno=fds[0])

    def connect(self, port: int, host: str | None = None, timeout: float = 10.0) -> socket.socket:
        """Connect from the external address to ``host`` (default: this machine's side of the link)."""
        s = self.socket()
        s.settimeout(timeout)
        s.connect((host or self.gateway_ip, port))
        return s

    def close(self) -> None:
        self._ctl.close()
        try:
            self._factory.wait(5)
        except subprocess.TimeoutExpired:
            self._factory.kill()
        self._destroy()


@pytest.fixture
def external_host():
    host = ExternalHost()
    yield host
    host.close()


class FloodHost(ExternalHost):
    """An external host that owns a whole /19 of 198.19.0.0/16 besides its link address: a local route for the
    prefix in the namespace (any of its 8,192 addresses can be bound without adding each) and a route to it through
    the veth on this side (it goes with the link). ``connect(port, source=…)`` comes from that address: a
    rotating-address flood."""

    PREFIX_LEN = 19

    def __init__(self) -> None:
        super().__init__()
        for _attempt in range(20):
            base = (198 << 24) | (19 << 16) | (random.randrange(8) << (32 - self.PREFIX_LEN))
            self.prefix = f"{socket.inet_ntoa(base.to_bytes(4, 'big'))}/{self.PREFIX_LEN}"
            if _ip("route", "add", self.prefix, "via", self.client_ip, "dev", self.veth_host).returncode == 0:
                break  # a prefix no other test host routes now
        else:
            self.close()
            raise RuntimeError("could not route a flood prefix to the test network namespace")
        self._base = base
        if _ip("-n", self.ns, "route", "add", "local", self.prefix, "dev", "lo").returncode != 0:
            self.close()
            raise RuntimeError(f"could not make {self.prefix} local in {self.ns}")

    def address(self, i: int) -> str:
        """The ``i``-th address of the prefix (wrapping; never the network or broadcast address)."""
        size = 1 << (32 - self.PREFIX_LEN)
        return socket.inet_ntoa((self._base + 1 + i % (size - 2)).to_bytes(4, "big"))

    def connect(self, port: int, host: str | None = None, timeout: float = 10.0, source: str = "") -> socket.socket:
        s = self.socket()
        s.settimeout(timeout)
        if source:
            s.bind((source, 0))
        s.connect((host or self.gateway_ip, port))
        return s


@pytest.fixture
def flood_host():
    host = FloodHost()
    yield host
    host.close()
