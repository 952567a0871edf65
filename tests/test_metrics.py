"""Shared traffic counters, the stat:metrics document and the Prometheus exposition, without a fleet.

Real shared memory (the fleet's SharedState), real processes for the writers, a real redis-server for the
publisher, the real prometheus_client parser for the exposition.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import select
import signal
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sentin8 import refusals, routing
from sentin8.config import load_bytes
from sentin8.metrics.prometheus import exposition
from sentin8.metrics.publisher import MetricsPublisher
from sentin8.metrics.scales import LATENCY_BOUNDS_S, handshake_reason, quantile_ms, status_slot
from sentin8.metrics.summary import service_stats
from sentin8.shm import counters as c
from sentin8.shm.services import ServiceNames
from sentin8.shm.state import SharedState
from tests.peers import wait_until


def shared(services: int = 16, slots: int = 4) -> SharedState:
    cfg = load_bytes(f"[shm]\nmetrics_services = {services}\nsnapshot_bytes = 65536\n".encode())
    return SharedState(cfg, slots)


def table_for(state: SharedState, *services: str) -> routing.RoutingTable:
    routes = [routing.Route(f"{s}.apps.test", s) for s in services]
    table = routing.build(routes, [], time.time())
    table.with_service_ids(state.service_names().assign, extra=("acme",))
    state.snapshot_writer().publish(routing.encode(table))
    return table


def prom(state: SharedState, accept: str | None = None) -> dict[tuple[str, tuple], float]:
    body, content_type = exposition(state, accept)
    assert content_type.startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


# ---- scales ------------------------------------------------------------------------------------------------


def test_status_slots_and_latency_scale() -> None:
    assert status_slot(200) != status_slot(201)
    assert status_slot(299) == status_slot(298)  # unregistered 2xx share the class slot
    assert status_slot(999) == status_slot(42) != status_slot(299)
    assert quantile_ms([0] * 18, 0.5) == 0.0
    one_bucket = [0, 100] + [0] * 16  # all between 0.25 and 0.5 ms
    assert 0.25 <= quantile_ms(one_bucket, 0.5) <= 0.5
    assert 0.25 <= quantile_ms(one_bucket, 0.99) <= 0.5
    assert len(LATENCY_BOUNDS_S) == 17 and all(b2 / b1 <= 3 for b1, b2 in itertools.pairwise(LATENCY_BOUNDS_S))


def test_handshake_reasons_are_a_fixed_set() -> None:
    assert handshake_reason("timeout") == "timeout"
    assert handshake_reason("tls: no suitable key share") == "classical_only"
    assert handshake_reason("tls: unsupported protocol") == "protocol_version"
    assert handshake_reason("tls: wrong version number") == "protocol_error"
    assert handshake_reason("tls: unexpected eof while reading") == "eof"
    assert {handshake_reason(x) for x in ("a", "b", "")} == {"protocol_error"}
    assert set(c.HANDSHAKE_REASONS) >= {"classical_only", "timeout", "protocol_version", "eof", "protocol_error"}


# ---- service index -------------------------------------------------------------------------------------------


def test_service_index_is_fixed_for_the_fleet_life_and_bounded() -> None:
    state = shared(services=5)  # _none, _other + 3
    names = state.service_names()
    first = names.assign(["web", "api"])
    assert first == {"web": 2, "api": 3}
    # a respawned resolver reads the same table: same indexes, new names after them, overflow -> _other
    again = ServiceNames(state.region.view("services"), 5).assign(["api", "shop", "web", "late", "x" * 300])
    assert again == {"api": 3, "shop": 4, "web": 2, "late": 1, "x" * 300: 1}
    assert names.names() == ["_none", "_other", "web", "api", "shop"]
    table = table_for(state, "web", "late")
    assert table.resolve("web.apps.test").sidx == 2
    assert table.resolve("late.apps.test").sidx == 1  # counted under _other, never dropped
    assert table.service_id("acme") == 1 and table.service_id("nope") == 1
    decoded = routing.decode(routing.encode(table))
    assert decoded.resolve("web.apps.test").sidx == 2


def test_an_out_of_range_index_counts_under_other() -> None:
    state = shared(services=4)
    w = state.worker_counters(0)
    w.request(99, 200, 0.001)
    w.request(-1, 200, 0.001)
    words = state.counter_reader().read(4)
    row = c.MAX_COUNTERS + 1 * c.SERVICE_WORDS
    assert words[row + status_slot(200)] == 2


# ---- exposition ----------------------------------------------------------------------------------------------


def test_exposition_is_prometheus_text_with_the_documented_names() -> None:
    state = shared()
    table = table_for(state, "web", "api")
    web, api = table.resolve("web.apps.test").sidx, table.resolve("api.apps.test").sidx
    w0, w1 = state.worker_counters(0), state.worker_counters(1)
    w0.claim(0)
    w1.claim(1)
    for i in range(30):
        (w0 if i % 2 else w1).request(web, 200, 0.0004 * (i + 1))
    for _ in range(7):
        w0.request(api, 503, 0.2)
    w0.request(web, 299, 0.001)
    w0.upstream(web, "upstream_cold")
    for _ in range(4):
        w1.upstream(web, "upstream_warm")
    w1.upstream(api, "upstream_stale_retry")
    w0.l4_connection(api)
    w0.l4_closed(api, 100, 2000)
    w1.l4_closed(api, 1, 20)
    w0.traffic(True)
    w0.traffic(False)
    w1.traffic(False)
    w0.handshake_error("classical_only")
    w0.refused(refusals.RATE_LIMIT)
    w1.refused(refusals.Refusal(None, "a kind nobody declared"))
    w0.add_gauge("active_connections", 3)
    w0.inc("l7_connections_h1", 2)
    w1.inc("l7_connections_h2")
    w1.inc("h2_premature_resets")
    w0.inc("h2_continuation_flood", 3)
    got = prom(state)
    assert got[("sentin8_l7_connections_total", (("protocol", "h1"),))] == 2
    assert got[("sentin8_l7_connections_total", (("protocol", "h2"),))] == 1
    assert got[("sentin8_h2_refusals_total", (("reason", "h2_premature_resets"),))] == 1
    assert got[("sentin8_h2_refusals_total", (("reason", "h2_continuation_flood"),))] == 3
    assert got[("sentin8_h2_refusals_total", (("reason", "h2_traffic_flood"),))] == 0
    assert got[("sentin8_requests_total", (("service", "web"), ("status", "200")))] == 30
    assert got[("sentin8_requests_total", (("service", "web"), ("status", "2xx")))] == 1
    assert got[("sentin8_requests_total", (("service", "api"), ("status", "503")))] == 7
    assert got[("sentin8_request_duration_seconds_count", (("service", "web"),))] == 31
    assert got[("sentin8_request_duration_seconds_bucket", (("le", "+Inf"), ("service", "web")))] == 31
    assert got[("sentin8_request_duration_seconds_bucket", (("le", "0.005"), ("service", "web")))] == 13  # 12 + the 299
    assert got[("sentin8_request_duration_seconds_count", (("service", "api"),))] == 7
    assert got[("sentin8_request_duration_seconds_sum", (("service", "api"),))] == pytest.approx(1.4)
    assert got[("sentin8_upstream_connections_total", (("kind", "warm"), ("service", "web")))] == 4
    assert got[("sentin8_upstream_connections_total", (("kind", "cold"), ("service", "web")))] == 1
    assert got[("sentin8_upstream_connections_total", (("kind", "stale_retry"), ("service", "api")))] == 1
    assert got[("sentin8_l4_connections_total", (("service", "api"),))] == 1
    assert got[("sentin8_l4_bytes_total", (("direction", "in"), ("service", "api")))] == 101
    assert got[("sentin8_l4_bytes_total", (("direction", "out"), ("service", "api")))] == 2020
    assert got[("sentin8_connections_total", (("side", "external"),))] == 1
    assert got[("sentin8_connections_total", (("side", "internal"),))] == 2
    assert got[("sentin8_handshake_errors_total", (("reason", "classical_only"),))] == 1
    assert got[("sentin8_policy_blocks_total", (("kind", "rate_limit"),))] == 1
    assert got[("sentin8_policy_blocks_total", (("kind", "other"),))] == 1
    assert got[("sentin8_events_total", (("name", "policy_blocked"),))] == 2  # the sum of the kinds
    assert got[("sentin8_active_connections", ())] == 3
    assert got[("sentin8_snapshot_stale", ())] == 0
    assert 0 <= got[("sentin8_snapshot_age_seconds", ())] < 60
    assert got[("sentin8_worker_rss_bytes", (("worker", "0"),))] > 1_000_000
    assert got[("sentin8_worker_rss_bytes", (("worker", "1"),))] > 1_000_000
    totals = state.counter_reader().total()  # fleet-wide histogram derived from the services' (SIGUSR1, /health)
    assert sum(totals[n] for n in c.LATENCY_NAMES[:-1]) == 38  # not cumulative, like the old fleet-wide names
    assert sum(totals[n] for n in c.LATENCY_NAMES[:5]) == 13 and c.LATENCY_NAMES[4] == "latency_le_5ms"
    stats = service_stats(state)
    assert stats["web"]["requests"] == 31 and stats["web"]["status_2xx"] == 31
    assert stats["web"]["by_status"] == {"200": 30, "2xx": 1}
    assert stats["api"]["status_5xx"] == 7 and stats["api"]["l4_connections"] == 1
    assert (stats["api"]["l4_bytes_in"], stats["api"]["l4_bytes_out"]) == (101, 2020)
    assert (totals["l4_bytes_in"], totals["l4_bytes_out"]) == (101, 2020)  # the fleet-wide words too
    assert sum(n for _, n in stats["api"]["latency_buckets_ms"]) == 7
    body, content_type = exposition(state, "application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text") and body.rstrip().endswith(b"# EOF")


# ---- monotonic totals ----------------------------------------------------------------------------------------


def _fork(target) -> int:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = target()
        finally:
            os._exit(code)
    return pid


def test_sigkilled_writers_never_make_a_total_go_down() -> None:
    """Writers in real processes are SIGKILLed mid-increment and folded at reap (as the supervisor does),
    while another process samples totals: every sample is >= the previous one, nothing is lost or doubled."""
    state = shared(slots=3)
    sidx = table_for(state, "web").resolve("web.apps.test").sidx
    reader = state.counter_reader()
    row = c.MAX_COUNTERS + sidx * c.SERVICE_WORDS
    ok = row + status_slot(200)
    stop_r, stop_w = os.pipe()

    def sample() -> int:
        os.close(stop_w)
        r = state.counter_reader()
        last, samples = (0, 0), 0
        while not select.select([stop_r], [], [], 0)[0]:
            words = r.read()
            now = (words[ok], words[row + c.S_WARM])
            if now[0] < last[0] or now[1] < last[1]:
                return 3  # a total went down
            last, samples = now, samples + 1
        return 0 if samples > 10 else 4

    sampler = _fork(sample)
    os.close(stop_r)
    for round_ in range(6):
        slot = round_ % 3

        def write(slot: int = slot) -> int:
            w = state.worker_counters(slot)
            w.claim(slot)
            while True:
                w.request(sidx, 200, 0.001)
                w.upstream(sidx, "upstream_warm")

        before = reader.read()[ok]
        pid = _fork(write)
        wait_until(lambda b=before: reader.read()[ok] > b + 1000, what="writer counting")
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        final = reader.read()[ok]
        reader.zero_gauges(slot)
        reader.retire(slot)
        assert reader.read()[ok] == final  # folded, not lost, not doubled
        assert reader.writers() == []  # a dead writer's pid is cleared with its block
    os.close(stop_w)
    _, status = os.waitpid(sampler, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the sampler saw a total go down (3) or too few samples (4)"
    words = reader.read()
    assert 0 <= words[ok] - words[row + c.S_WARM] <= 6  # a kill may land between the two increments
    assert 0 <= words[ok] - sum(words[row + c.S_LATENCY : row + c.S_LATENCY + 18]) <= 6


# ---- the stat:metrics document over a real redis-server ------------------------------------------------------


def test_documents_carry_deltas_that_sum_to_totals_and_an_outage_loses_nothing(redis_server) -> None:
    state = shared()
    table = table_for(state, "web")
    web = table.resolve("web.apps.test").sidx
    w = state.worker_counters(0)
    w.claim(0)
    channel = f"stat:metrics:{os.getpid()}"
    sub = redis_server.client().pubsub(ignore_subscribe_messages=True)
    sub.subscribe(channel)
    publisher = MetricsPublisher(state.counter_reader(), state.service_names(), redis_server.url, channel, 1.0)
    docs: list[dict] = []

    def publish() -> bool:
        return asyncio.run(_publish_once(publisher))

    def receive() -> None:
        msg = wait_until(lambda: sub.get_message(timeout=0.2), 5, what="a document")
        docs.append(json.loads(msg["data"]))

    for _ in range(5):
        w.request(web, 200, 0.003)
    w.request(web, 404, 0.0001)
    w.upstream(web, "upstream_cold")
    w.inc("l7_connections_h2", 2)
    w.inc("h2_control_flood")
    assert publish()
    receive()
    assert docs[0]["l7_connections"] == {"h1": 0, "h2": 2} and docs[0]["h2_refusals"] == {"h2_control_flood": 1}
    for _ in range(3):
        w.request(web, 200, 0.07)
    assert publish()
    receive()
    redis_server.stop()
    w.request(web, 200, 1.5)
    assert not publish()  # skipped and counted
    assert state.counter_reader().header(c.H_PUBLISH_FAILED) == 1
    redis_server.start()
    sub = redis_server.client().pubsub(ignore_subscribe_messages=True)
    sub.subscribe(channel)
    assert publish()
    receive()
    assert [d["seq"] for d in docs] == [1, 2, 3]
    assert all(d["v"] == 1 and d["interval_s"] == 1.0 and d["host"] and d["version"] for d in docs)

    def total(service: str, status: str) -> int:
        return sum(r["count"] for d in docs for r in d["requests"] if (r["service"], r["status"]) == (service, status))

    assert total("web", "200") == 9  # the outage's request is in the next document: nothing lost
    assert total("web", "404") == 1
    assert [sum(x["count"] for x in d["latency_ms"]) for d in docs] == [6, 3, 1]
    assert docs[1]["latency_ms"][0]["p50"] >= 50 and docs[1]["latency_ms"][0]["max"] == 70.0
    assert docs[2]["latency_ms"][0]["max"] == 1500.0  # the max of that interval only
    assert docs[0]["upstream"] == [{"service": "web", "warm": 0, "cold": 1, "stale_retry": 0}]
    assert docs[1]["upstream"] == []
    assert docs[1]["l7_connections"] == {"h1": 0, "h2": 0} and docs[1]["h2_refusals"] == {}  # deltas


async def _publish_once(publisher: MetricsPublisher) -> bool:
    try:
        return await publisher.publish_once()
    finally:
        client, publisher._client = publisher._client, None
        if client is not None:
            await client.aclose()


def test_certificate_expiry_is_exposed_from_the_store(tmp_path) -> None:
    from sentin8.certstore import CertStore

    cfg = load_bytes(f'[tls]\ncert_dir = "{tmp_path}/certs"\nstate_dir = "{tmp_path}/state"\n'.encode())
    state = SharedState(cfg, 2)
    assert not [k for k in prom(state) if k[0] == "sentin8_certificate_expiry_seconds"]  # nothing to serve yet
    CertStore(f"{tmp_path}/certs", f"{tmp_path}/state").bootstrap()  # what the first worker does
    got = prom(state)
    left = got[("sentin8_certificate_expiry_seconds", (("hostname", "bootstrap"), ("source", "bootstrap")))]
    assert 23 * 3600 < left <= 24 * 3600
