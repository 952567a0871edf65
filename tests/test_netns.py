"""The external test host really is external: the server sees its non-private source address."""

from __future__ import annotations

import socket

from sentin8.config import DEFAULT_INTERNAL_CIDRS
from sentin8.netclass import Classifier
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
