"""The management API's read models, sans-IO: health status rules, backends, mappings at 100,000 names."""

from __future__ import annotations

import time

from sentin8 import routing
from sentin8.mgmt import views
from sentin8.routing import Instance, Route


def table(stale: bool = False, built_at: float = 1000.0) -> routing.RoutingTable:
    insts = [Instance("w1", "web", "10.0.0.1", 80, health_ts=990.0), Instance("w2", "web", "10.0.0.2", 80, "Draining"),
             Instance("a1", "api", "10.0.0.3", 443, tls=True, health_ts=900.0)]
    routes = [Route("shop.example.com", "web", "e1", "a1"), Route("*.example.org", "api")]
    return routing.build(routes, insts, built_at, stale)


def test_health_status_and_codes():
    assert views.health(table(), "running", 2, {}, 1010.0, "1")[0] == 200
    _, body = views.health(table(), "running", 2, {"active_connections": 3}, 1010.0, "1")
    assert body["status"] == "ok" and body["snapshot_age_s"] == 10.0 and body["active_connections"] == 3
    assert body["instances"] == {"Active": 2, "Draining": 1} and body["mappings"] == 2 and body["services"] == 2
    assert views.health(table(stale=True), "running", 2, {}, 1010.0, "1")[1]["status"] == "stale"
    assert views.health(table(stale=True), "running", 2, {}, 1010.0, "1")[0] == 200
    assert views.health(table(), "draining", 2, {}, 1010.0, "1")[:1] == (503,)
    assert views.health(None, "running", 0, {}, 1010.0, "1")[1]["status"] == "starting"
    assert views.health(table(), "starting", 0, {}, 1010.0, "1")[0] == 503


def test_backends_judge_freshness_now_and_report_suspects():
    marks = {"w1": int(1005.5e6)}
    body = views.backends(table(), lambda i: marks.get(i, 0), 1000.0, 30)
    web = {r["id"]: r for r in body["services"]["web"]}
    assert web["w1"]["fresh"] and web["w1"]["suspect"] == 5.5 and web["w1"]["health_age_s"] == 10.0
    assert not web["w2"]["fresh"] and web["w2"]["suspect"] is None
    assert body["services"]["api"][0]["fresh"] is False and body["services"]["api"][0]["tls"] is True


def test_mappings_at_100k_names_are_fast():
    routes = [Route(f"app{i}.env{i % 50}.example.com", f"svc{i % 300}") for i in range(100_000)]
    big = routing.build(routes, [], 1.0)
    t0 = time.perf_counter()
    index = views.MappingIndex(big, "postgres")
    build_ms = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    page = index.query(None, None, 1000, 50_000)
    page_ms = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    found = index.query("APP99999.", None, 1000, 0)
    filter_ms = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    by_service = index.query(None, "svc7", 10, 0)
    service_ms = (time.perf_counter() - t0) * 1000
    print(f"100k mappings: index {build_ms:.1f} ms, page {page_ms:.2f} ms, host filter {filter_ms:.1f} ms,"
          f" service filter {service_ms:.1f} ms")
    assert page["total"] == 100_000 and len(page["mappings"]) == 1000
    assert found["total"] == 1 and found["mappings"][0]["hostname"] == "app99999.env49.example.com"
    assert by_service["total"] == 334 and len(by_service["mappings"]) == 10
    assert page["mappings"][0]["source"] == "postgres"
    assert page_ms < 50 and filter_ms < 250 and service_ms < 250 and build_ms < 1000  # generous on a shared box


def test_stats_exposes_histogram_in_order():
    totals = {"requests": 5, "latency_le_1ms": 2, "latency_le_inf": 1, "latency_le_10ms": 2}
    body = views.stats(totals, 1.0, latency_buckets=views.latency_buckets(totals))
    assert body["fleet"]["requests"] == 5
    assert body["latency_buckets_ms"] == [[1.0, 2], [10.0, 2], [None, 1]]


def test_stats_gives_every_policy_block_kind_and_handshake_error_reason():
    totals = {"policy_block_rate_limit": 3, "policy_block_conn_cap": 2, "policy_block_header_caps": 0,
              "handshake_error_classical_only": 4, "handshake_error_timeout": 1, "policy_blocked": 5}
    body = views.stats(totals, 1.0)
    assert body["policy_blocks"] == {"rate_limit": 3, "conn_cap": 2, "header_caps": 0}
    assert body["handshake_errors"] == {"classical_only": 4, "timeout": 1}


def test_backends_judge_freshness_on_the_registry_health_clock():
    t = table()
    t.health_frozen_at = 1000.0  # the registry became unreadable at 1000: heartbeats are judged then
    body = views.backends(t, lambda i: 0, 1100.0, 30)
    w1 = next(r for r in body["services"]["web"] if r["id"] == "w1")
    assert w1["fresh"] is True and w1["health_age_s"] == 110.0  # fresh as workers judge it; the age is real
