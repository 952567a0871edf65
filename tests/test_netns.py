"""The external test host really is external: the server sees its non-private source address; and two hosts alive
at once never share a link, even when they draw the same /30."""

from __future__ import annotations

import random
import socket

from sentin8.config import DEFAULT_INTERNAL_CIDRS
from sentin8.netclass import Classifier
from tests import netns
from tests.netns import external_host  # noqa: F401 - fixture


def test_external_host_connects_with_an_external_address(external_host):  # noqa: F811
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen(1)
    port = server.getsockname()[1]
    client = external_host.connect(port)
    conn, addr = server.accept()
    assert addr[0] == external_host.client_ip
    assert not Classifier(DEFAULT_INTERNAL_CIDRS).is_internal(addr[0])
    client.sendall(b"x")
    assert conn.recv(1) == b"x"
    for s in (client, conn, server):
        s.close()


def test_a_second_host_that_draws_a_taken_link_draws_again_and_both_connect(external_host, monkeypatch):  # noqa: F811
    first = external_host
    taken = (int.from_bytes(socket.inet_aton(first.gateway_ip), "big") - ((198 << 24) | (18 << 16))) >> 2
    draws = iter([taken])  # the second host's first draw is the first host's /30, then random again
    real = random.randrange
    monkeypatch.setattr(netns.random, "randrange", lambda *a: next(draws, None) or real(*a))
    second = netns.ExternalHost()
    monkeypatch.undo()
    try:
        assert second.gateway_ip != first.gateway_ip
        with socket.create_server(("0.0.0.0", 0)) as server:
            port = server.getsockname()[1]
            for host in (first, second):
                with host.connect(port, timeout=5) as client:
                    accepted, peer = server.accept()
                    accepted.close()
                    assert peer[0] == client.getsockname()[0] == host.client_ip
    finally:
        second.close()
