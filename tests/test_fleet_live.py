"""The whole fleet on live sources: a private Valkey-compatible server and a private PostgreSQL, real
backends, real connections through the L4 path."""

from __future__ import annotations

import json
import ssl
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from sentin8.sources.domains import CHANGED_CHANNEL as DOMAIN_CHANNEL
from sentin8.sources.registry import CHANGED_CHANNEL as REGISTRY_CHANNEL
from tests.netns import external_host  # noqa: F401 - fixture
from tests.peers import roundtrip, wait_until
from tests.servers import PostgresServer, RedisServer, install_sys_schema

APPS = "apps.test"
ORG, ENV = str(uuid.UUID(int=1)), str(uuid.UUID(int=11))


def hostname(app: str) -> str:
    return f"{app}.prod.acme.{APPS}"


class Platform:
    """What Captain and Sys would write: registry hashes, sys.* rows, and the change events."""

    def __init__(self, redis: RedisServer, pg: PostgresServer) -> None:
        self.redis = redis
        self.pg = pg
        self.proxy_dsn = install_sys_schema(pg, "platform")
        self.admin_dsn = pg.dsn(db="platform")
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO sys.orgs VALUES (%s, 'acme', 'active')", (ORG,))
            conn.execute("INSERT INTO sys.envs VALUES (%s, %s, 'prod', 'active')", (ENV, ORG))

    def add_app(self, slug: str, service: str) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO sys.app_instances VALUES (%s, %s, %s, %s, %s, 'active')",
                (str(uuid.uuid4()), ENV, slug, service, []),
            )
        self.redis.client().publish(DOMAIN_CHANNEL, slug)

    def set_instance(
        self,
        service: str,
        iid: str,
        port: int,
        state: str = "Active",
        age: float = 0.0,
        publish: bool = True,
        host: str = "127.0.0.1",
        tls: bool = True,
    ) -> None:
        value = {"host": host, "port": port, "state": state, "health_ts": time.time() - age, "tls": tls}
        client = self.redis.client()
        client.hset(f"captain:svc:{service}", iid, json.dumps(value))
        if publish:
            client.publish(REGISTRY_CHANNEL, service)

    def sources(self, health_fresh_s: float = 30) -> str:
        return f"""
[sources]
registry = "valkey"
domains = "postgres"
valkey_url = "{self.redis.url}"
postgres_dsn = "{self.proxy_dsn}"
apps_domain = "{APPS}"
poll_interval_s = 30
health_fresh_s = {health_fresh_s}
health_refresh_s = {health_fresh_s / 3:g}
boot_retries = 10
boot_retry_interval_s = 0.5
"""


@pytest.fixture
def platform(redis_server, postgres_server) -> Platform:
    return Platform(redis_server, postgres_server)


def routes_to(port: int, sni: str, name: bytes) -> bool:
    try:
        return roundtrip(port, sni) == name + b":ping"
    except (ssl.SSLError, OSError):
        return False


def test_new_app_routes_within_two_seconds_of_its_events(platform, backend_factory, fleet_factory):
    a = backend_factory("a", hostname("shop"))
    fleet = fleet_factory("", extra=platform.sources())
    assert not routes_to(fleet.port, hostname("shop"), b"a")  # unknown yet: closed
    t0 = time.monotonic()
    platform.set_instance("shop", "shop-1", a.port)
    platform.add_app("shop", "shop")
    wait_until(lambda: routes_to(fleet.port, hostname("shop"), b"a"), 5, 0.02, what="new app routed")
    elapsed = time.monotonic() - t0
    print(f"event -> first routed connection: {elapsed * 1000:.0f} ms")
    assert elapsed < 2.5  # the registry debounce is 1 s; allow for a loaded 2-core CI machine


def test_a_registry_host_that_is_a_name_is_resolved_and_routed(platform, backend_factory, fleet_factory):
    """Captain may register a DNS name: the worker resolves it off its loop (workers.connect) and pipes."""
    a = backend_factory("a", hostname("named"))
    platform.set_instance("named", "named-1", a.port, host="localhost")
    platform.add_app("named", "named")
    fleet = fleet_factory("", extra=platform.sources())
    wait_until(lambda: routes_to(fleet.port, hostname("named"), b"a"), 5, what="named instance routed")
    for _ in range(3):
        assert roundtrip(fleet.port, hostname("named")) == b"a:ping"
    stats = fleet.stats()
    assert stats.get("backend_connect_errors", 0) == 0 and stats.get("gauge_underflow", 0) == 0


def test_bridge_mode_to_a_named_instance_sends_sni_and_checks_the_name(
    platform,
    fleet_factory,
    external_host,  # noqa: F811 - fixture
    tmp_path,
):
    """The whole L7 path as a worker wires it: a registry instance whose host is a name ("localhost") and
    tls = true, upstream.ca_file set. The name is resolved off the loop, sent as SNI and verified: a backend
    whose certificate names another host is refused (502) and counted, never sent the request."""
    from supervisor.demo import write_demo_cert
    from tests.peers import HTTPBackend
    from tests.pqclient import PQClient

    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    good_pair = write_demo_cert(str(tmp_path / "good"), "localhost")
    bad_pair = write_demo_cert(str(tmp_path / "bad"), "elsewhere.internal")
    ca_file = tmp_path / "ca.pem"  # both self-signed certificates are trusted: only the name can fail
    ca_file.write_bytes(Path(good_pair[0]).read_bytes() + Path(bad_pair[0]).read_bytes())
    good, bad = HTTPBackend("good", tls=good_pair), HTTPBackend("bad", tls=bad_pair)
    try:
        platform.set_instance("good", "good-1", good.port, host="localhost")
        platform.set_instance("bad", "bad-1", bad.port, host="localhost")
        platform.add_app("good", "good")
        platform.add_app("bad", "bad")
        fleet = fleet_factory(
            "",
            extra=platform.sources() + f'[upstream]\nca_file = "{ca_file}"\n',
            host="0.0.0.0",
        )

        def get(app: str) -> bytes:
            client = PQClient(external_host.connect(fleet.port), hostname(app))
            try:
                client.handshake()
                return client.request(b"GET /x HTTP/1.1\r\nHost: %s\r\n\r\n" % hostname(app).encode())
            finally:
                client.close()

        wait_until(lambda: get("good").startswith(b"HTTP/1.1 200 "), 10, 0.2, what="good routed over TLS")
        assert good.sni_seen and set(good.sni_seen) == {"localhost"}
        assert json.loads(get("good").partition(b"\r\n\r\n")[2])["backend"] == "good"
        assert get("bad").startswith(b"HTTP/1.1 502 ")
        assert bad.requests == []
        assert fleet.stats().get("backend_connect_errors", 0) >= 1
    finally:
        good.close()
        bad.close()


def test_draining_and_stale_instances_get_no_new_connections(platform, backend_factory, fleet_factory):
    a, b = backend_factory("a", hostname("shop")), backend_factory("b", hostname("shop"))
    platform.set_instance("shop", "shop-a", a.port)
    platform.set_instance("shop", "shop-b", b.port)
    platform.add_app("shop", "shop")
    fleet = fleet_factory("", extra=platform.sources(health_fresh_s=3))

    def beating(b_state: str | None, name: bytes, times: int = 1):
        """Heartbeats go on as Captain's do (unannounced), so a slow fleet start never makes them stale."""

        def check() -> bool:
            platform.set_instance("shop", "shop-a", a.port, publish=False)
            if b_state is not None:
                platform.set_instance("shop", "shop-b", b.port, state=b_state, publish=False)
            return all(routes_to(fleet.port, hostname("shop"), name) for _ in range(times))

        return check

    wait_until(beating("Active", b"b"), 15, what="b serving")
    # Captain marks b Draining and says so: new connections go to a only
    platform.set_instance("shop", "shop-b", b.port, state="Draining")
    wait_until(beating("Draining", b"a", 6), 15, what="b drained")
    # b back Active, and announced
    platform.set_instance("shop", "shop-b", b.port)
    wait_until(beating("Active", b"b"), 15, what="b back")
    # b's heartbeats stop while a's go on (unannounced, as Captain does): b leaves rotation on time
    wait_until(beating(None, b"a", 6), 20, 0.2, what="b stale")


def test_valkey_and_postgres_outages_serve_the_stale_table_then_recover(platform, backend_factory, fleet_factory):
    a, b = backend_factory("a", hostname("shop")), backend_factory("b", hostname("cart"))
    platform.set_instance("shop", "shop-a", a.port)
    platform.add_app("shop", "shop")
    fleet = fleet_factory("", extra=platform.sources())
    wait_until(lambda: routes_to(fleet.port, hostname("shop"), b"a"), 5, what="shop serving")

    platform.redis.stop(kill=True)
    for _ in range(10):  # routing continues on the last good table
        assert routes_to(fleet.port, hostname("shop"), b"a")
    platform.redis.start()  # a fresh server: Captain re-registers and announces
    platform.set_instance("shop", "shop-a", a.port)
    platform.set_instance("cart", "cart-b", b.port)
    platform.add_app("cart", "cart")
    wait_until(lambda: routes_to(fleet.port, hostname("cart"), b"b"), 15, what="changes flow after Valkey restart")

    platform.pg.stop()
    for _ in range(10):
        assert routes_to(fleet.port, hostname("shop"), b"a")
        assert routes_to(fleet.port, hostname("cart"), b"b")
    platform.pg.start()
    platform.set_instance("blog", "blog-a", a.port)
    platform.add_app("blog", "blog")
    wait_until(lambda: routes_to(fleet.port, hostname("blog"), b"a"), 15, what="changes flow after Postgres restart")
