"""Edge protection through the whole fleet (issue 12): external PQ TLS clients, two workers, shared memory."""

from __future__ import annotations

import time

import pytest

from tests.netns import external_host  # noqa: F401 - fixture
from tests.peers import HTTPBackend
from tests.pqclient import PQClient
from tests.test_fleet_l7 import l7_fleet, request


@pytest.fixture
def web():
    backend = HTTPBackend("web")
    yield backend
    backend.close()


def _head(resp: bytes) -> tuple[int, dict[str, str]]:
    head = resp.partition(b"\r\n\r\n")[0].split(b"\r\n")
    headers = {k.strip().lower().decode(): v.strip().decode() for k, v in (ln.split(b":", 1) for ln in head[1:])}
    return int(head[0].split()[1]), headers


def test_429_carries_retry_after_and_the_connection_stays_usable(external_host, fleet_factory, web):  # noqa: F811
    fleet = l7_fleet(
        fleet_factory, web, extra="[policy]\nrate_limit = true\nrate_limit_rps = 1\nrate_limit_burst = 2\n"
    )
    client = PQClient(external_host.connect(fleet.port), "shop.apps.test")
    client.handshake()
    get = b"GET /x HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n"
    statuses = []
    for _ in range(3):
        status, headers = _head(client.request(get))
        statuses.append(status)
    assert statuses == [200, 200, 429]
    assert headers["retry-after"] == "1" and "connection" not in headers
    assert headers["ratelimit-policy"] == '"edge";q=1;w=1' and headers["ratelimit"].startswith('"edge";r=0;t=')
    # a second connection (possibly the other worker) shares the bucket
    status, _, _ = request(external_host, fleet, "shop.apps.test", get)
    assert status == 429
    time.sleep(float(headers["retry-after"]))  # what a well-behaved client does with Retry-After
    status, _ = _head(client.request(get))
    assert status == 200  # the same TLS connection: no new handshake was needed
    client.close()
    stats = fleet.stats()
    assert stats["http_429"] == 2 and stats["policy_rate_limit"] == 2 and stats["handshake_ok"] == 2


def test_external_client_without_sni_gets_421(external_host, fleet_factory, web):  # noqa: F811
    fleet = l7_fleet(fleet_factory, web)
    status, _, _ = request(external_host, fleet, None, b"GET / HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n")
    assert status == 421
    assert web.requests == []
