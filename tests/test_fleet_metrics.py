"""Traffic metrics through the whole fleet: external PQ TLS clients, a real redis-server receiving stat:metrics.

``metrics.interval_s = 1``: a count must show up in the documents within two intervals, exactly.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.netns import external_host  # noqa: F401 - fixture
from tests.peers import roundtrip, wait_until
from tests.pqclient import PQClient

INTERVAL = 1.0


class Documents:
    """Every document published on the channel, raw and parsed, collected by a subscriber thread."""

    def __init__(self, redis_server, channel: str) -> None:
        self.raw: list[bytes] = []
        self.docs: list[dict] = []
        self.arrivals: list[float] = []
        self._server = redis_server
        self._channel = channel
        self._pubsub = self._subscribe()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _subscribe(self):
        pubsub = self._server.client().pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(self._channel)
        return pubsub

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self._pubsub.get_message(timeout=0.2)
            except Exception:  # the server was stopped on purpose: subscribe again once it is back
                self._stop.wait(0.2)
                try:
                    self._pubsub = self._subscribe()
                except Exception:
                    pass
                continue
            if msg and msg["type"] == "message":
                self.raw.append(msg["data"])
                self.docs.append(json.loads(msg["data"]))
                self.arrivals.append(time.monotonic())

    def resubscribe(self) -> None:
        old, self._pubsub = self._pubsub, self._subscribe()
        try:
            old.close()
        except Exception:
            pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._pubsub.close()

    def requests(self, service: str, status: str) -> int:
        key = (service, status)
        return sum(r["count"] for d in list(self.docs) for r in d["requests"] if (r["service"], r["status"]) == key)

    def latency_count(self, service: str) -> int:
        return sum(x["count"] for d in list(self.docs) for x in d["latency_ms"] if x["service"] == service)

    def upstream(self, service: str) -> dict[str, int]:
        out = {"warm": 0, "cold": 0, "stale_retry": 0}
        for d in list(self.docs):
            for u in d["upstream"]:
                if u["service"] == service:
                    for k in out:
                        out[k] += u[k]
        return out

    def traffic(self, side: str, what: str) -> int:
        return sum(d["traffic"][side][what] for d in list(self.docs))


@pytest.fixture
def documents(redis_server):
    channel = f"stat:metrics:test:{secrets.token_hex(4)}"
    docs = Documents(redis_server, channel)
    docs.channel = channel
    yield docs
    docs.close()


def metrics_fleet(fleet_factory, backend, redis_server, channel: str, workers: int = 1, log: str = "", **kw):
    return fleet_factory(
        f"""
[metrics]
valkey_url = "{redis_server.url}"
channel = "{channel}"
interval_s = {INTERVAL}
{log}
[[instances]]
service = "web"
id = "web-1"
host = "127.0.0.1"
port = {backend.port}
[[domains]]
hostname = "shop.apps.test"
service = "web"
""",
        workers=workers,
        host="0.0.0.0",
        **kw,
    )


def scrape(fleet) -> tuple[bytes, dict[tuple[str, tuple], float]]:
    """GET /metrics on the management port (no token), parsed by prometheus_client's own parser."""
    with urllib.request.urlopen(fleet.mgmt_url + "/metrics", timeout=5) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
        body = resp.read()
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return body, out


def keepalive_requests(host, fleet, n: int, raw: bytes = b"GET /ok HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n") -> None:
    client = PQClient(host.connect(fleet.port), "shop.apps.test")
    try:
        client.handshake()
        for _ in range(n):
            assert client.request(raw).startswith(b"HTTP/1.1 200")
    finally:
        client.close()


def misdirected(host, fleet) -> None:
    client = PQClient(host.connect(fleet.port), "shop.apps.test")
    try:
        client.handshake()
        assert client.request(b"GET / HTTP/1.1\r\nHost: other.apps.test\r\n\r\n").startswith(b"HTTP/1.1 421")
    finally:
        client.close()


def test_k_requests_are_exactly_k_in_the_documents_within_two_intervals(
    external_host, fleet_factory, web, redis_server, documents  # noqa: F811
):
    fleet = metrics_fleet(fleet_factory, web, redis_server, documents.channel, workers=1)
    k = 25
    keepalive_requests(external_host, fleet, k)  # one connection: one cold upstream connect, then warm
    misdirected(external_host, fleet)
    misdirected(external_host, fleet)
    classical = PQClient(external_host.connect(fleet.port), "shop.apps.test", classical=True)
    with pytest.raises(Exception):  # noqa: B017 - any TLS failure is the point
        classical.handshake()
    classical.close()
    done = time.monotonic()
    wait_until(lambda: documents.requests("web", "200") >= k, 4 * INTERVAL + 5, what="K in the documents")
    seen_at = documents.arrivals[-1]
    # two intervals, plus slack for a machine shared with other test runs
    assert seen_at - done <= 2 * INTERVAL + 1.5, f"took {seen_at - done:.2f} s"
    time.sleep(2 * INTERVAL + 0.5)  # later documents must not add to it
    assert documents.requests("web", "200") == k
    assert documents.requests("_none", "421") == 2
    assert documents.latency_count("web") == k  # histogram count == request count
    assert documents.upstream("web") == {"warm": k - 1, "cold": 1, "stale_retry": 0}
    assert documents.traffic("external", "requests") == k + 2
    assert documents.traffic("external", "connections") == 4
    errors = [d["handshake_errors"] for d in documents.docs if d["handshake_errors"]]
    assert errors == [{"classical_only": 1}], errors
    seqs = [d["seq"] for d in documents.docs]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # consecutive: no document lost in between
    doc = documents.docs[-1]
    assert doc["v"] == 1 and doc["interval_s"] == INTERVAL and doc["pid"] > 0 and doc["host"] and doc["version"]
    assert set(doc) == {
        "v", "ts", "host", "pid", "version", "interval_s", "seq", "traffic", "requests", "latency_ms",
        "handshake_errors", "policy_blocks", "upstream", "l4_connections", "l7_connections", "h2_refusals",
    }  # fmt: skip
    assert sum(d["l7_connections"]["h1"] for d in documents.docs) == 3  # by protocol; the classical one failed
    assert sum(d["l7_connections"]["h2"] for d in documents.docs) == 0


def test_sigkilled_worker_and_rolling_reload_never_lose_a_count(
    external_host, fleet_factory, web, redis_server, documents  # noqa: F811
):
    fleet = metrics_fleet(fleet_factory, web, redis_server, documents.channel, workers=2)
    sent = 0
    totals = []

    def batch(n: int) -> None:
        nonlocal sent
        for _ in range(n):
            keepalive_requests(external_host, fleet, 3)
            sent += 3
        totals.append(fleet.stats()["requests"])

    batch(6)
    victim = next(iter(fleet.workers()))
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: fleet.saw("child_died"), 10, what="the supervisor noticed")
    wait_until(lambda: len(fleet.workers()) == 2 and victim not in fleet.workers(), 15, what="respawned")
    totals.append(fleet.stats()["requests"])
    batch(6)
    before = set(fleet.workers())
    fleet.signal(signal.SIGHUP)  # rolling reload: every worker replaced
    wait_until(lambda: not (set(fleet.workers()) & before) and len(fleet.workers()) == 2, 30, what="reloaded")
    totals.append(fleet.stats()["requests"])
    batch(6)
    assert totals == sorted(totals), totals  # SIGUSR1 totals never went down
    assert totals[-1] == sent
    wait_until(lambda: documents.requests("web", "200") >= sent, 4 * INTERVAL + 10, what="all in the documents")
    time.sleep(2 * INTERVAL + 0.5)
    assert documents.requests("web", "200") == sent  # nothing lost, nothing counted twice
    assert documents.latency_count("web") == sent


@pytest.mark.parametrize("access_log", [False, True])
def test_canary_never_leaves_the_process(
    external_host, fleet_factory, web, redis_server, documents, access_log  # noqa: F811
):
    log = "[log]\naccess = true" if access_log else ""
    fleet = metrics_fleet(fleet_factory, web, redis_server, documents.channel, workers=1, log=log, mgmt=True)
    canary = "cnry" + secrets.token_hex(12)
    body = f"secret={canary}".encode()
    raw = (
        f"POST /p/{canary}?q={canary} HTTP/1.1\r\nHost: shop.apps.test\r\nCookie: session={canary}\r\n"
        f"X-Canary: {canary}\r\nUser-Agent: {canary}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    keepalive_requests(external_host, fleet, 3, raw)
    # the same string where routing and policy look: an unknown Host, and a malformed request
    client = PQClient(external_host.connect(fleet.port), "shop.apps.test")
    client.handshake()
    resp = client.request(f"GET /{canary} HTTP/1.1\r\nHost: {canary}.apps.test\r\n\r\n".encode())
    assert resp.startswith(b"HTTP/1.1 421")
    client.close()
    wait_until(lambda: documents.requests("web", "200") >= 3, 4 * INTERVAL + 5, what="the requests in a document")
    assert any(canary in h for h in web.requests[0]["path"].split("/"))  # it did reach the backend
    for raw_doc in documents.raw:
        assert canary.encode() not in raw_doc
    page, got = scrape(fleet)
    assert got[("sentin8_requests_total", (("service", "web"), ("status", "200")))] == 3
    assert canary.encode() not in page
    fleet.stats()
    out = fleet.output()
    assert canary not in out
    access = fleet.events("access")
    if access_log:
        assert len(access) == 4
        first = access[0]
        assert first["method"] == "POST" and first["status"] == 200 and first["service"] == "web"
        assert first["instance"] == "web-1" and first["correlation_id"].startswith("proxy-")
        assert first["bytes_in"] == len(body) and first["bytes_out"] > 0 and first["duration_ms"] > 0
        assert {a["status"] for a in access} == {200, 421}
        assert not {"path", "query", "headers", "body", "target", "url"} & set(first)
    else:
        assert access == []
    assert re.search(r'"event":"metrics_publisher_start"', out)


def test_prometheus_scrape_matches_the_documents_and_never_goes_down(
    external_host, fleet_factory, web, redis_server, documents  # noqa: F811
):
    fleet = metrics_fleet(fleet_factory, web, redis_server, documents.channel, workers=2, mgmt=True)
    wait_until(lambda: _up(fleet), 15, what="mgmt up")
    canary = "cnry" + secrets.token_hex(12)
    k = 12
    keepalive_requests(
        external_host,
        fleet,
        k,
        f"GET /{canary}?{canary} HTTP/1.1\r\nHost: shop.apps.test\r\nX-A: {canary}\r\n\r\n".encode(),
    )
    misdirected(external_host, fleet)
    body, got = scrape(fleet)
    assert canary.encode() not in body
    ok = ("sentin8_requests_total", (("service", "web"), ("status", "200")))
    assert got[ok] == k
    assert got[("sentin8_requests_total", (("service", "_none"), ("status", "421")))] == 1
    assert got[("sentin8_request_duration_seconds_count", (("service", "web"),))] == k
    assert got[("sentin8_request_duration_seconds_bucket", (("le", "+Inf"), ("service", "web")))] == k
    warm = got[("sentin8_upstream_connections_total", (("kind", "warm"), ("service", "web")))]
    cold = got[("sentin8_upstream_connections_total", (("kind", "cold"), ("service", "web")))]
    assert (warm, cold) == (k - 1, 1)
    assert got[("sentin8_connections_total", (("side", "external"),))] == 2
    assert got[("sentin8_snapshot_stale", ())] == 0
    rss = [v for (name, _), v in got.items() if name == "sentin8_worker_rss_bytes"]
    assert len(rss) == 2 and all(v > 10_000_000 for v in rss)
    wait_until(lambda: documents.requests("web", "200") == k, 4 * INTERVAL + 5, what="the same K in the documents")
    # a SIGKILLed worker and a rolling reload: the scraped totals never go down
    seen = [got[ok]]
    os.kill(next(iter(fleet.workers())), signal.SIGKILL)
    seen.append(scrape(fleet)[1].get(ok, 0))
    wait_until(lambda: len(fleet.workers()) == 2, 15, what="respawned")
    keepalive_requests(external_host, fleet, 3)
    seen.append(scrape(fleet)[1][ok])
    before = set(fleet.workers())
    fleet.signal(signal.SIGHUP)
    wait_until(lambda: not (set(fleet.workers()) & before) and len(fleet.workers()) == 2, 30, what="reloaded")
    seen.append(scrape(fleet)[1][ok])
    assert seen == sorted(seen) and seen[-1] == k + 3, seen
    assert canary not in fleet.output()


def _up(fleet) -> bool:
    try:
        scrape(fleet)
    except OSError:
        return False
    return True


def test_a_valkey_outage_skips_documents_never_a_request_and_loses_no_count(
    external_host, fleet_factory, web, redis_server, documents  # noqa: F811
):
    fleet = metrics_fleet(fleet_factory, web, redis_server, documents.channel, workers=1)
    keepalive_requests(external_host, fleet, 5)
    wait_until(lambda: documents.requests("web", "200") == 5, 4 * INTERVAL + 5, what="before the outage")
    redis_server.stop()
    started = time.monotonic()
    keepalive_requests(external_host, fleet, 20)  # served while Valkey is gone
    assert time.monotonic() - started < 5, "requests slowed down by the outage"
    wait_until(lambda: fleet.saw("metrics_publish_failed"), 4 * INTERVAL + 5, what="the skipped document counted")
    last_seq = documents.docs[-1]["seq"]
    redis_server.start()
    documents.resubscribe()  # at once: the publisher's next tick is up to one interval away
    wait_until(lambda: fleet.saw("metrics_publish_recovered"), 4 * INTERVAL + 10, what="publishing again")
    wait_until(lambda: documents.docs[-1]["seq"] > last_seq + 1, 10, what="documents after the outage")
    time.sleep(2 * INTERVAL + 0.5)
    after = [d["seq"] for d in documents.docs if d["seq"] > last_seq]
    if after[0] != last_seq + 1:
        pytest.skip("a document went out in the milliseconds before the test subscribed again")
    assert after == list(range(last_seq + 1, last_seq + 1 + len(after)))  # skipped ones never took a number
    assert documents.requests("web", "200") == 25  # carried by the first document after the outage


def test_policy_blocks_by_kind_and_l4_connections_per_service(
    external_host, fleet_factory, web, redis_server, documents, backend_factory  # noqa: F811
):
    db = backend_factory("db", "db.internal.test")
    fleet = fleet_factory(
        f"""
[metrics]
valkey_url = "{redis_server.url}"
channel = "{documents.channel}"
interval_s = {INTERVAL}
[policy]
waf = true
max_headers = 10
[[instances]]
service = "web"
id = "web-1"
host = "127.0.0.1"
port = {web.port}
[[instances]]
service = "db"
id = "db-1"
host = "127.0.0.1"
port = {db.port}
[[domains]]
hostname = "shop.apps.test"
service = "web"
[[domains]]
hostname = "db.internal.test"
service = "db"
""",
        workers=1,
        host="0.0.0.0",
    )

    def one(raw: bytes) -> bytes:
        client = PQClient(external_host.connect(fleet.port), "shop.apps.test")
        try:
            client.handshake()
            return client.request(raw)
        finally:
            client.close()

    assert one(b"GET /?q=1%27%20OR%201=1-- HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n").startswith(b"HTTP/1.1 403")
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(20))
    assert one(b"GET / HTTP/1.1\r\nHost: shop.apps.test\r\n" + many + b"\r\n").startswith(b"HTTP/1.1 431")
    for _ in range(3):  # loopback is internal: SNI-routed L4 to the db service, never decrypted
        assert roundtrip(fleet.port, "db.internal.test") == b"db:ping"
    wait_until(lambda: documents.traffic("internal", "connections") >= 3, 4 * INTERVAL + 5, what="L4 in documents")
    wait_until(lambda: _sum_policy(documents) == {"waf": 1, "header_caps": 1}, 4 * INTERVAL + 5, what="blocks")
    l4 = [x for d in documents.docs for x in d["l4_connections"]]
    assert sum(x["count"] for x in l4 if x["service"] == "db") == 3
    assert documents.requests("web", "403") == 1
    assert documents.requests("_none", "431") == 1  # refused before any service was resolved


def _sum_policy(documents: Documents) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in list(documents.docs):
        for kind, n in d["policy_blocks"].items():
            out[kind] = out.get(kind, 0) + n
    return out
