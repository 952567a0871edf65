"""Prometheus exposition of the shared counters: a ``prometheus_client`` custom collector, no hand-made text.

``exposition(shared, accept)`` is what the management app serves at ``GET /metrics``: it reads the shared
counters (live worker blocks + the retired block, so totals never go down), names service rows from the
shared service table, and renders the text format (or OpenMetrics when the scraper asks for it).
Labels are service names and fixed reason/kind/status words: never a path, query or header value.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import psutil
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from .. import routing
from ..certstore import CertStore
from ..shm import counters as c
from ..shm.snapshot import SnapshotCache
from ..shm.state import SharedState
from .scales import LATENCY_BOUNDS_S, LATENCY_BUCKETS, STATUS_LABELS


def _le(bound: float) -> str:
    return repr(bound)  # "0.00025", "60.0": what Prometheus' own clients print


_LE = [*(_le(b) for b in LATENCY_BOUNDS_S), "+Inf"]


class SharedCountersCollector(Collector):
    """Reads shared memory at each scrape; holds no counts of its own."""

    def __init__(self, shared: SharedState) -> None:
        self.reader = shared.counter_reader()
        self.names = shared.service_names()
        self.routes = SnapshotCache(shared.snapshot_reader(), routing.decode)  # decodes only when it changed
        self.tls_dirs = shared.tls_dirs
        self._certs: CertStore | None = None

    def collect(self) -> Iterator[Metric]:
        names = self.names.names()
        words = self.reader.read(len(names))
        total = {name: words[i] for i, name in enumerate(c.NAMES)}

        requests = CounterMetricFamily(
            "sentin8_requests", "L7 requests answered, by service and status code", labels=["service", "status"]
        )
        duration = HistogramMetricFamily(
            "sentin8_request_duration_seconds",
            "L7 request start to last response byte, by service",
            labels=["service"],
        )
        upstream = CounterMetricFamily(
            "sentin8_upstream_connections",
            "Upstream connections used for L7 requests: warm (pooled), cold (new), stale_retry (pooled one "
            "found closed, retried)",
            labels=["service", "kind"],
        )
        l4 = CounterMetricFamily("sentin8_l4_connections", "Internal connections piped at L4", labels=["service"])
        l4_bytes = CounterMetricFamily(
            "sentin8_l4_bytes",
            "Bytes piped at L4, counted as each pipe closes: in = client to backend, out = backend to client",
            labels=["service", "direction"],
        )
        for sidx, service in enumerate(names):
            row = c.MAX_COUNTERS + sidx * c.SERVICE_WORDS
            for slot, label in enumerate(STATUS_LABELS):
                n = words[row + c.S_STATUS + slot]
                if n:
                    requests.add_metric([service, label], n)
            buckets = words[row + c.S_LATENCY : row + c.S_LATENCY + LATENCY_BUCKETS]
            if any(buckets):
                cumulative, acc = [], 0
                for le, n in zip(_LE, buckets, strict=True):
                    acc += n
                    cumulative.append((le, acc))
                duration.add_metric([service], cumulative, sum_value=words[row + c.S_LAT_SUM_US] / 1e6)
            for kind, offset in c.UPSTREAM_KINDS.items():
                n = words[row + offset]
                if n:
                    upstream.add_metric([service, kind], n)
            n = words[row + c.S_L4]
            if n:
                l4.add_metric([service], n)
            for direction, offset in (("in", c.S_L4_BYTES_IN), ("out", c.S_L4_BYTES_OUT)):
                n = words[row + offset]
                if n:
                    l4_bytes.add_metric([service, direction], n)
        yield from (requests, duration, upstream, l4, l4_bytes)

        connections = CounterMetricFamily("sentin8_connections", "Accepted connections by source side", labels=["side"])
        for side in ("external", "internal"):
            connections.add_metric([side], total[f"traffic_{side}_connections"])
        yield connections
        protocols = CounterMetricFamily(
            "sentin8_l7_connections", "L7 client connections by the protocol ALPN chose", labels=["protocol"]
        )
        for proto, i in c.L7_PROTOCOLS.items():
            protocols.add_metric([proto], words[i])
        yield protocols
        h2_refusals = CounterMetricFamily(
            "sentin8_h2_refusals",
            "HTTP/2 refusals by reason: floods, premature resets, GOAWAYs, malformed requests",
            labels=["reason"],
        )
        for reason, i in c.H2_REFUSALS.items():
            h2_refusals.add_metric([reason], words[i])
        yield h2_refusals
        handshake = CounterMetricFamily(
            "sentin8_handshake_errors", "Failed client TLS handshakes by reason", labels=["reason"]
        )
        for reason, i in c.HANDSHAKE_REASONS.items():
            handshake.add_metric([reason], words[i])
        yield handshake
        policy = CounterMetricFamily(
            "sentin8_policy_blocks", "Requests and connections refused by policy, by kind", labels=["kind"]
        )
        for kind, i in c.POLICY_KINDS.items():
            policy.add_metric([kind], words[i])
        yield policy
        events = CounterMetricFamily(
            "sentin8_events",
            "Every fleet-wide data-plane counter by name (peek, accept, errors, ...)",
            labels=["name"],
        )
        for name, value in total.items():
            if name not in c.GAUGES:
                events.add_metric([name], value)
        yield events

        yield GaugeMetricFamily(
            "sentin8_active_connections", "L7 requests in flight (the drain signal)", value=total["active_connections"]
        )
        yield GaugeMetricFamily("sentin8_l4_active", "L4 pipes open", value=total["l4_active"])
        yield GaugeMetricFamily(
            "sentin8_open_connections", "Connections held by workers, any stage", value=total["open_connections"]
        )
        yield from self._snapshot()
        yield from self._publisher()
        yield self._rss()
        yield self._certificates()

    def _certificates(self) -> Metric:
        """Seconds until each servable certificate expires (negative once expired): the store's own reading
        (stat-revalidated, read only: this never generates a bootstrap certificate)."""
        expiry = GaugeMetricFamily(
            "sentin8_certificate_expiry_seconds",
            "Seconds until the certificate's notAfter, per served certificate",
            labels=["hostname", "source"],
        )
        if self._certs is None:
            self._certs = CertStore(*self.tls_dirs)
        now = time.time()
        for cert in self._certs.expiry():
            expiry.add_metric([cert.hostname, cert.source], round(cert.seconds_left(now)))
        return expiry

    def _snapshot(self) -> Iterator[Metric]:
        table = self.routes.current()
        built_at = table.built_at if table is not None and table.built_at else 0.0
        age = max(0.0, time.time() - built_at) if built_at else float("nan")
        yield GaugeMetricFamily(
            "sentin8_snapshot_age_seconds",
            "Age of the routing data the workers serve (NaN before the first)",
            value=age,
        )
        yield GaugeMetricFamily(
            "sentin8_snapshot_stale",
            "1 while a source is failing and the last good table is served",
            value=1.0 if table is not None and table.stale else 0.0,
        )
        yield GaugeMetricFamily(
            "sentin8_services_indexed",
            "Service names in the shared metrics table (bounded by shm.metrics_services)",
            value=self.names.count(),
        )

    def _publisher(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "sentin8_metrics_documents", "stat:metrics documents published", value=self.reader.header(c.H_PUBLISHED)
        )
        yield CounterMetricFamily(
            "sentin8_metrics_publish_failures",
            "stat:metrics documents skipped (Valkey unreachable)",
            value=self.reader.header(c.H_PUBLISH_FAILED),
        )

    def _rss(self) -> Metric:
        """One series per worker index, stable across respawns and reloads (a ``pid`` label would start a new
        series each time): while a reload drains the old process beside its replacement, both count."""
        rss = GaugeMetricFamily("sentin8_worker_rss_bytes", "Resident memory of each worker process", labels=["worker"])
        by_worker: dict[int, int] = {}
        for worker, pid in self.reader.writers():
            try:
                value = psutil.Process(pid).memory_info().rss
            except psutil.Error:  # exited between the read and now: the supervisor clears its block soon
                continue
            by_worker[worker] = by_worker.get(worker, 0) + value
        for worker, value in sorted(by_worker.items()):
            rss.add_metric([str(worker)], value)
        return rss


_registries: dict[int, tuple[SharedState, CollectorRegistry]] = {}


def _registry(shared: SharedState) -> CollectorRegistry:
    got = _registries.get(id(shared))
    if got is None or got[0] is not shared:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SharedCountersCollector(shared))
        got = (shared, registry)
        _registries[id(shared)] = got
    return got[1]


def exposition(shared: SharedState, accept: str | None = None) -> tuple[bytes, str]:
    """(body, content type) for ``GET /metrics``: the text format, or OpenMetrics when ``accept`` asks."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(_registry(shared)), content_type
