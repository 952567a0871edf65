"""Availability under load: registry and domain-source outages (issue 8 part 1).

Real Valkey (persistent, so a SIGKILLed one comes back with its data as a production one would), real
PostgreSQL, real backends, internal L4 clients on loopback and external PQ-TLS L7 clients from a network
namespace, a real fleet. Every client failure counts.
"""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
import redis

from sentin8.sources.registry import CHANGED_CHANNEL as REGISTRY_CHANNEL
from tests.load import Load
from tests.netns import external_host  # noqa: F401 - fixture
from tests.peers import HTTPBackend, wait_until
from tests.servers import running_redis
from tests.test_fleet_live import Platform, hostname, routes_to

OUTAGE_S = float(os.environ.get("SENTIN8_OUTAGE_S", "60"))
HEALTH_FRESH_S = 3.0  # far shorter than the outage: without the paused clock every instance would go stale


class Captain(threading.Thread):
    """Heartbeats every registered instance twice a second, as Captain does: unannounced, and failing
    quietly (retrying) while Valkey is down."""

    def __init__(self, server) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.instances: dict[tuple[str, str], dict] = {}
        self.lock = threading.Lock()
        self.halt = threading.Event()

    def register(self, service: str, iid: str, port: int, tls: bool) -> None:
        with self.lock:
            self.instances[(service, iid)] = {"host": "127.0.0.1", "port": port, "state": "Active", "tls": tls}
        self._beat(announce=service)

    def _beat(self, announce: str | None = None) -> None:
        try:
            client = self.server.client()
            with self.lock:
                items = list(self.instances.items())
            for (service, iid), value in items:
                client.hset(f"captain:svc:{service}", iid, json.dumps({**value, "health_ts": time.time()}))
            if announce:
                client.publish(REGISTRY_CHANNEL, announce)
        except redis.exceptions.RedisError:
            pass

    def run(self) -> None:
        while not self.halt.wait(0.5):
            self._beat()


@pytest.fixture
def outage_platform(postgres_server):
    with running_redis(persist=True) as server:
        platform = Platform(server, postgres_server)
        captain = Captain(server)
        captain.start()
        yield platform, captain
        captain.halt.set()


def _loaded_fleet(platform, captain, backend_factory, fleet_factory, external_host):  # noqa: F811
    shop = backend_factory("shop", hostname("shop"))
    web = HTTPBackend("web")
    captain.register("shop", "shop-1", shop.port, tls=True)
    captain.register("web", "web-1", web.port, tls=False)
    platform.add_app("shop", "shop")
    platform.add_app("web", "web")
    platform.add_app("cart", "cart")  # routed, but no instance yet: the registry change made after the outage
    fleet = fleet_factory("", extra=platform.sources(health_fresh_s=HEALTH_FRESH_S), host="0.0.0.0")
    wait_until(lambda: routes_to(fleet.port, hostname("shop"), b"shop"), 10, what="shop routed")
    load = Load()
    load.l4(fleet.port, hostname("shop"), b"shop:", new_conns=2, keepalive=1)
    load.l7(lambda: external_host.connect(fleet.port), hostname("web"), new_conns=1, keepalive=1)
    return fleet, load, web


def test_valkey_sigkilled_for_a_minute_under_load_costs_no_request(
    outage_platform, backend_factory, fleet_factory, external_host  # noqa: F811
):
    platform, captain = outage_platform
    fleet, load, web = _loaded_fleet(platform, captain, backend_factory, fleet_factory, external_host)
    try:
        wait_until(lambda: load.total() > 20, 20, what="load flowing")
        before = load.total()
        platform.redis.stop(kill=True)
        time.sleep(OUTAGE_S)  # the outage itself: the load runs meanwhile
        during = load.total() - before
        platform.redis.start()
        t0 = time.monotonic()
        cart = backend_factory("cart", hostname("cart"))
        captain.register("cart", "cart-1", cart.port, tls=True)
        wait_until(lambda: routes_to(fleet.port, hostname("cart"), b"cart"), 10, 0.05, what="cart routed")
        routed_after = time.monotonic() - t0
        time.sleep(2 * HEALTH_FRESH_S)  # past the resumed clock's window: Captain's fresh heartbeats carry it
    finally:
        load.stop()
        web.close()
    print(f"valkey outage {OUTAGE_S:.0f} s: {during} good exchanges during it, {load.ok}; "
          f"registry change routed {routed_after:.2f} s after restart")
    assert load.errors == [], load.errors[:10]
    assert during > OUTAGE_S  # traffic really flowed through the outage
    assert routed_after < 3.0
    assert load.ok["l7_keepalive"] > 0 and load.ok["l4_keepalive"] > 0


def test_postgres_crashed_for_a_minute_under_load_costs_no_request(
    outage_platform, backend_factory, fleet_factory, external_host  # noqa: F811
):
    platform, captain = outage_platform
    fleet, load, web = _loaded_fleet(platform, captain, backend_factory, fleet_factory, external_host)
    try:
        wait_until(lambda: load.total() > 20, 20, what="load flowing")
        before = load.total()
        platform.pg.stop(mode="immediate")
        time.sleep(OUTAGE_S)
        during = load.total() - before
        platform.pg.start()
        t0 = time.monotonic()
        blog = backend_factory("blog", hostname("blog"))
        captain.register("blog", "blog-1", blog.port, tls=True)
        platform.add_app("blog", "blog")
        wait_until(lambda: routes_to(fleet.port, hostname("blog"), b"blog"), 10, 0.05, what="blog routed")
        routed_after = time.monotonic() - t0
    finally:
        load.stop()
        web.close()
    print(f"postgres outage {OUTAGE_S:.0f} s: {during} good exchanges during it, {load.ok}; "
          f"domain change routed {routed_after:.2f} s after restart")
    assert load.errors == [], load.errors[:10]
    assert during > OUTAGE_S
    assert routed_after < 3.0
