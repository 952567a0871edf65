"""Prometheus exposition of the shared counters: a ``prometheus_client`` custom collector, no hand-made text.

``exposition(shared, accept)`` is what the management app serves at ``GET /metrics``: it reads the shared
counters (live worker blocks + the retired block, so totals never go down), names service rows from the
shared service table, and renders the text format (or OpenMetrics when the scraper asks for it).
Labels are service names and fixed reason/kind/status words: never a path, query or header value.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

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


@dataclass(frozen=True)
class Family:
    """One metric family ``/metrics`` exposes: declared here once, so the collector builds it from this row and
    the metrics reference (docs/metrics.md, ``python -m sentin8.docgen``) lists exactly what is exposed."""

    name: str  # counters are exposed with the ``_total`` suffix prometheus_client adds
    kind: Literal["counter", "gauge", "histogram"]
    help: str
    labels: tuple[str, ...] = ()

    def exposed(self) -> str:
        return f"{self.name}_total" if self.kind == "counter" else self.name

    def make(self, **value: float) -> Metric:
        cls = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily, "histogram": HistogramMetricFamily}
        if self.labels:
            return cls[self.kind](self.name, self.help, labels=list(self.labels))
        return cls[self.kind](self.name, self.help, **value)


FAMILIES: tuple[Family, ...] = (
    Family("sentin8_requests", "counter", "L7 requests answered, by service and status code", ("service", "status")),
    Family(
        "sentin8_request_duration_seconds",
        "histogram",
        "L7 request start to last response byte, by service",
        ("service",),
    ),
    Family(
        "sentin8_upstream_connections",
        "counter",
        "Upstream connections used for L7 requests: warm (pooled), cold (new), stale_retry (pooled one found closed,"
        " retried)",
        ("service", "kind"),
    ),
    Family("sentin8_l4_connections", "counter", "Internal connections piped at L4", ("service",)),
    Family(
        "sentin8_l4_bytes",
        "counter",
        "Bytes piped at L4, counted as each pipe closes: in = client to backend, out = backend to client",
        ("service", "direction"),
    ),
    Family("sentin8_connections", "counter", "Accepted connections by source side", ("side",)),
    Family("sentin8_l7_connections", "counter", "L7 client connections by the protocol ALPN chose", ("protocol",)),
    Family(
        "sentin8_h2_refusals",
        "counter",
        "HTTP/2 refusals by reason: floods, premature resets, GOAWAYs, malformed requests",
        ("reason",),
    ),
    Family("sentin8_handshake_errors", "counter", "Failed client TLS handshakes by reason", ("reason",)),
    Family("sentin8_policy_blocks", "counter", "Requests and connections refused by policy, by kind", ("kind",)),
    Family(
        "sentin8_events",
        "counter",
        "Every fleet-wide data-plane counter by name (peek, accept, errors, ...)",
        ("name",),
    ),
    Family("sentin8_active_connections", "gauge", "L7 requests in flight (the drain signal)"),
    Family("sentin8_l4_active", "gauge", "L4 pipes open"),
    Family("sentin8_open_connections", "gauge", "Connections held by workers, any stage"),
    Family("sentin8_snapshot_age_seconds", "gauge", "Age of the routing data the workers serve (NaN before the first)"),
    Family("sentin8_snapshot_stale", "gauge", "1 while a source is failing and the last good table is served"),
    Family(
        "sentin8_services_indexed",
        "gauge",
        "Service names in the shared metrics table (bounded by shm.metrics_services)",
    ),
    Family("sentin8_metrics_documents", "counter", "stat:metrics documents published"),
    Family("sentin8_metrics_publish_failures", "counter", "stat:metrics documents skipped (Valkey unreachable)"),
    Family("sentin8_worker_rss_bytes", "gauge", "Resident memory of each worker process", ("worker",)),
    Family(
        "sentin8_certificate_expiry_seconds",
        "gauge",
        "Seconds until the certificate's notAfter, per served certificate",
        ("hostname", "source"),
    ),
)
_FAMILY = {f.name: f for f in FAMILIES}


def _new(name: str, **value: float) -> Metric:
    return _FAMILY[name].make(**value)


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
        self.cluster = shared.cluster_status() if shared.cluster_enabled else None

    def collect(self) -> Iterator[Metric]:
        names = self.names.names()
        words = self.reader.read(len(names))
        total = {name: words[i] for i, name in enumerate(c.NAMES)}

        requests = _new("sentin8_requests")
        duration = _new("sentin8_request_duration_seconds")
        upstream = _new("sentin8_upstream_connections")
        l4 = _new("sentin8_l4_connections")
        l4_bytes = _new("sentin8_l4_bytes")
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

        connections = _new("sentin8_connections")
        for side in ("external", "internal"):
            connections.add_metric([side], total[f"traffic_{side}_connections"])
        yield connections
        protocols = _new("sentin8_l7_connections")
        for proto, i in c.L7_PROTOCOLS.items():
            protocols.add_metric([proto], words[i])
        yield protocols
        h2_refusals = _new("sentin8_h2_refusals")
        for reason, i in c.H2_REFUSALS.items():
            h2_refusals.add_metric([reason], words[i])
        yield h2_refusals
        handshake = _new("sentin8_handshake_errors")
        for reason, i in c.HANDSHAKE_REASONS.items():
            handshake.add_metric([reason], words[i])
        yield handshake
        policy = _new("sentin8_policy_blocks")
        for kind, i in c.POLICY_KINDS.items():
            policy.add_metric([kind], words[i])
        yield policy
        events = _new("sentin8_events")
        for name, value in total.items():
            if name not in c.GAUGES:
                events.add_metric([name], value)
        yield events

        yield _new("sentin8_active_connections", value=total["active_connections"])
        yield _new("sentin8_l4_active", value=total["l4_active"])
        yield _new("sentin8_open_connections", value=total["open_connections"])
        yield from self._snapshot()
        yield from self._publisher()
        yield from self._cluster()
        yield self._rss()
        yield self._certificates()

    def _certificates(self) -> Metric:
        """Seconds until each servable certificate expires (negative once expired): the store's own reading
        (stat-revalidated, read only: this never generates a bootstrap certificate)."""
        expiry = _new("sentin8_certificate_expiry_seconds")
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
        yield _new("sentin8_snapshot_age_seconds", value=age)
        yield _new("sentin8_snapshot_stale", value=1.0 if table is not None and table.stale else 0.0)
        yield _new("sentin8_services_indexed", value=self.names.count())

    def _publisher(self) -> Iterator[Metric]:
        yield _new("sentin8_metrics_documents", value=self.reader.header(c.H_PUBLISHED))
        yield _new("sentin8_metrics_publish_failures", value=self.reader.header(c.H_PUBLISH_FAILED))

    def _cluster(self) -> Iterator[Metric]:
        """Cluster mode's limiter syncer (docs/cluster.md), only when cluster mode is on."""
        if self.cluster is None:
            return
        st = self.cluster.snapshot()
        lag = st["sync_lag_s"]
        yield GaugeMetricFamily(
            "sentin8_cluster_limiter_global",
            "1 while the limiter is global, 0 while it falls back to local limits",
            value=1.0 if st["limiter"] == "global" else 0.0,
        )
        yield GaugeMetricFamily("sentin8_cluster_hosts_seen", "Hosts seen in the cluster (H)", value=st["hosts_seen"])
        yield GaugeMetricFamily(
            "sentin8_cluster_sync_lag_seconds",
            "Since the last successful limiter sync (NaN before the first)",
            value=float("nan") if lag is None else lag,
        )
        yield GaugeMetricFamily(
            "sentin8_cluster_sync_round_trip_seconds",
            "The last sync interval's time in Valkey round trips",
            value=st["round_trip_s"],
        )
        yield GaugeMetricFamily(
            "sentin8_cluster_sync_batch_keys",
            "Keys in the last interval's largest sync batch (capped at 512)",
            value=st["batch_keys"],
        )
        yield GaugeMetricFamily(
            "sentin8_cluster_sync_batch_keys_max", "The largest sync batch since start", value=st["batch_keys_max"]
        )
        yield GaugeMetricFamily(
            "sentin8_cluster_sync_backlog", "Moved keys left queued for the next interval", value=st["backlog"]
        )
        yield CounterMetricFamily("sentin8_cluster_syncs", "Successful limiter sync intervals", value=st["syncs"])
        yield CounterMetricFamily("sentin8_cluster_keys_synced", "Keys sent to Valkey", value=st["keys_synced"])
        yield CounterMetricFamily(
            "sentin8_cluster_keys_skipped", "Moved keys not worth a round trip yet", value=st["keys_skipped"]
        )
        yield CounterMetricFamily(
            "sentin8_cluster_sync_errors", "Failed limiter syncs (Valkey unreachable or slow)", value=st["sync_errors"]
        )
        yield GaugeMetricFamily(
            "sentin8_cluster_ticket_keys_shared",
            "1 while this host seals session tickets with the cluster's shared ratchet, 0 with local keys",
            value=st["ticket_keys_shared"],
        )
        yield CounterMetricFamily(
            "sentin8_cluster_fallback_seconds",
            "Time the limiter spent in local fallback",
            value=st["fallback_seconds"],
        )

    def _rss(self) -> Metric:
        """One series per worker index, stable across respawns and reloads (a ``pid`` label would start a new
        series each time): while a reload drains the old process beside its replacement, both count."""
        rss = _new("sentin8_worker_rss_bytes")
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
