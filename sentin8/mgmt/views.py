"""Read models of the management API: what each endpoint answers, computed from a routing table, counter
totals, suspect marks and the fleet state. Sans-IO: plain values in, JSON-ready dicts out."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from ..routing import Route, RoutingTable
from ..selection import eligible

MAPPINGS_DEFAULT_LIMIT = 1000
MAPPINGS_MAX_LIMIT = 10_000

# counter names the dashboard and /stats expose (fleet totals); per-service figures slot in under "services"
STATS_COUNTERS = (
    "requests",
    "status_1xx",
    "status_2xx",
    "status_3xx",
    "status_4xx",
    "status_5xx",
    "status_other",
    "handshake_ok",
    "handshake_errors",
    "handshake_timeout",
    "policy_waf",
    "policy_rate_limit",
    "policy_blocked",
    "connections_l4",
    "connections_l7",
    "l4_bytes_in",  # client -> backend through L4 pipes, counted as each pipe closes
    "l4_bytes_out",
    "upstream_warm",
    "upstream_cold",
    "upstream_stale_retry",
    "upstream_errors",
    "backend_connect_errors",
    "unknown_sni",
    "no_backend",
    "latency_sum_us",
    "l4_active",
    "active_connections",
    "open_connections",
)
PER_WORKER_COUNTERS = ("accepted", "requests", "policy_rate_limit", "policy_waf", "active_connections")


def health(
    table: RoutingTable | None,
    fleet_state: str,
    workers_alive: int,
    totals: dict[str, int],
    now: float,
    version: str,
    tls: dict[str, Any] | None = None,
    cluster: dict[str, Any] | None = None,
) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body). 200 while serving (``ok`` or ``stale``), 503 while ``draining`` or ``starting``,
    so a load balancer in front of several proxies can act on the status code alone."""
    if fleet_state == "draining":
        status = "draining"
    elif table is None or fleet_state == "starting":
        status = "starting"
    elif table.stale:
        status = "stale"
    else:
        status = "ok"
    instances: Counter[str] = Counter()
    mappings = services = 0
    age = None
    if table is not None:
        mappings, services = len(table.routes), len(table.services)
        for insts in table.services.values():
            for inst in insts:
                instances[inst.state] += 1
        age = round(max(0.0, now - table.built_at), 3) if table.built_at else None
    body = {
        "status": status,
        "version": version,
        "snapshot_age_s": age,
        "stale": bool(table is not None and table.stale),
        "mappings": mappings,
        "services": services,
        "instances": dict(sorted(instances.items())),
        "active_connections": totals.get("active_connections", 0),
        "workers": workers_alive,
        # the TLS edge's own health (issue #13: certificates present but rejected, expiry) goes here
        "tls": tls if tls is not None else {},
        # cluster mode (docs/cluster.md): whether the limiter is global or fell back, the hosts seen; never
        # changes the status code (a host in fallback still serves, limiting alone)
        "cluster": cluster if cluster is not None else {},
    }
    return (200 if status in ("ok", "stale") else 503), body


def backends(
    table: RoutingTable | None, suspect_until_us: Callable[[str], int], now: float, health_fresh_s: float
) -> dict[str, Any]:
    """Per service, each instance with its state, heartbeat age (wall clock), freshness (exactly as a worker
    judges it at pick time, on the registry's health clock) and the seconds left on a suspect mark (null when
    not suspect)."""
    out: dict[str, list[dict[str, Any]]] = {}
    if table is None:
        return {"services": out}
    now_us = int(now * 1e6)
    judged_at = table.health_clock(now)  # as workers judge: it stands still while the registry is unreadable
    for service in sorted(table.services):
        insts = table.services[service]
        fresh_ids = {i.id for i in eligible(insts, judged_at, health_fresh_s)}
        rows = []
        for inst in insts:
            until = suspect_until_us(inst.id)
            rows.append(
                {
                    "id": inst.id,
                    "host": inst.host,
                    "port": inst.port,
                    "state": inst.state,
                    "health_age_s": None if inst.health_ts is None else round(now - inst.health_ts, 3),
                    "fresh": inst.id in fresh_ids,
                    "suspect": round((until - now_us) / 1e6, 3) if until > now_us else None,
                    "tls": inst.tls,
                    "proxy_protocol": inst.proxy_protocol,
                }
            )
        out[service] = rows
    return {"services": out}


class MappingIndex:
    """Hostname mappings of one routing table, sorted once, answered by slices: 100,000 names page in
    microseconds and filter in milliseconds."""

    def __init__(self, table: RoutingTable | None, source: str) -> None:
        self.source = source
        routes = table.routes if table is not None else {}
        self.names = sorted(routes)
        self.routes: dict[str, Route] = routes

    def _row(self, name: str) -> dict[str, Any]:
        route = self.routes[name]
        return {
            "hostname": name,
            "service": route.service,
            "env_id": route.env_id,
            "app_id": route.app_id,
            "source": self.source,
            "wildcard": name.startswith("*."),
        }

    def query(self, host: str | None, service: str | None, limit: int, offset: int) -> dict[str, Any]:
        """``host``: names containing it (case-insensitive); a name starting with it is found by bisection.
        ``service``: exact. ``total`` counts every match, the page holds ``limit`` from ``offset``."""
        names = self.names
        if host:
            needle = host.lower().rstrip(".")
            names = [n for n in names if needle in n]
        if service:
            routes = self.routes
            names = [n for n in names if routes[n].service == service]
        page = names[offset : offset + limit]
        return {"total": len(names), "offset": offset, "limit": limit, "mappings": [self._row(n) for n in page]}


def stats(
    totals: dict[str, int],
    now: float,
    services: dict[str, dict[str, Any]] | None = None,
    latency_buckets: list[tuple[float, int]] | None = None,
) -> dict[str, Any]:
    """What the dashboard polls every 2 s: cumulative fleet counters (it derives rates from two samples),
    the latency histogram, and per-service figures when the per-service counters exist (issue #9)."""
    return {
        "at": now,
        "fleet": {name: totals.get(name, 0) for name in STATS_COUNTERS},
        # every kind and reason the counters know, so a kind added later shows without touching the dashboard
        "policy_blocks": _by_prefix(totals, "policy_block_"),
        "handshake_errors": _by_prefix(totals, "handshake_error_"),
        "latency_buckets_ms": [[None if b == float("inf") else b, n] for b, n in (latency_buckets or [])],
        "services": services or {},
    }


def _by_prefix(totals: dict[str, int], prefix: str) -> dict[str, int]:
    return {name.removeprefix(prefix): n for name, n in totals.items() if name.startswith(prefix)}


def latency_buckets(totals: dict[str, int]) -> list[tuple[float, int]]:
    """The counters' latency histogram as (upper bound in ms, count) pairs, inf last."""
    out = []
    for name, value in totals.items():
        if name.startswith("latency_le_"):
            bound = name.removeprefix("latency_le_").removesuffix("ms")
            out.append((float("inf") if bound == "inf" else float(bound), value))
    return sorted(out)
