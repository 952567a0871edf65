"""The ``stat:metrics`` document (version 1): the deltas between two counter readings. Sans-IO.

Flush semantics: every count is what happened since the previous document, so the sum of the deltas of
consecutive documents is the exact total. Only non-zero entries are listed. Names in it are service names
and fixed reason/kind/status labels: never a path, query, header value or payload byte.
"""

from __future__ import annotations

import time
from importlib import metadata
from typing import Any

from ..shm import counters as c
from .scales import LATENCY_BUCKETS, STATUS_LABELS, quantile_ms

VERSION = 1


def package_version() -> str:
    try:
        return metadata.version("sentin8-proxy")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _delta(now: list[int], before: list[int], i: int) -> int:
    # a word the baseline does not cover yet (a service indexed since) started from zero
    return now[i] - (before[i] if i < len(before) else 0)


def build(
    now: list[int],
    before: list[int],
    service_names: list[str],
    *,
    seq: int,
    interval_s: float,
    host: str,
    pid: int,
    version: str,
    ts: float | None = None,
) -> dict[str, Any]:
    """The document for the counts in ``now`` (``CounterReader.read``) minus ``before`` (the last document's
    reading). Latency maxima are per-interval already (the max epoch), so ``max`` is taken from ``now``."""

    def d(i: int) -> int:
        return max(0, _delta(now, before, i))  # a total never goes down; guard the document anyway

    traffic = {
        side: {what: d(c.TRAFFIC_NAMES[(side, what)]) for what in ("connections", "requests")}
        for side in ("external", "internal")
    }
    handshake = {reason: d(i) for reason, i in c.HANDSHAKE_REASONS.items() if d(i)}
    policy = {kind: d(i) for kind, i in c.POLICY_KINDS.items() if d(i)}
    protocols = {p: d(i) for p, i in c.L7_PROTOCOLS.items()}
    h2_refusals = {reason: d(i) for reason, i in c.H2_REFUSALS.items() if d(i)}
    requests, latency, upstream, l4 = [], [], [], []
    used = min(len(service_names), (len(now) - c.MAX_COUNTERS) // c.SERVICE_WORDS)
    for sidx in range(used):
        service = service_names[sidx]
        row = c.MAX_COUNTERS + sidx * c.SERVICE_WORDS
        for slot, label in enumerate(STATUS_LABELS):
            n = d(row + c.S_STATUS + slot)
            if n:
                requests.append({"service": service, "status": label, "count": n})
        buckets = [d(row + c.S_LATENCY + b) for b in range(LATENCY_BUCKETS)]
        count = sum(buckets)
        if count:
            latency.append(
                {
                    "service": service,
                    "count": count,
                    "sum": round(d(row + c.S_LAT_SUM_US) / 1000.0, 3),
                    "p50": quantile_ms(buckets, 0.50),
                    "p90": quantile_ms(buckets, 0.90),
                    "p99": quantile_ms(buckets, 0.99),
                    "max": round(now[row + c.S_LAT_MAX_US] / 1000.0, 3),
                }
            )
        warm, cold, stale = d(row + c.S_WARM), d(row + c.S_COLD), d(row + c.S_STALE_RETRY)
        if warm or cold or stale:
            upstream.append({"service": service, "warm": warm, "cold": cold, "stale_retry": stale})
        n = d(row + c.S_L4)
        if n:
            l4.append({"service": service, "count": n})
    return {
        "v": VERSION,
        "ts": round(time.time() if ts is None else ts, 3),
        "host": host,
        "pid": pid,
        "version": version,
        "interval_s": interval_s,
        "seq": seq,
        "traffic": traffic,
        "requests": requests,
        "latency_ms": latency,
        "handshake_errors": handshake,
        "policy_blocks": policy,
        "upstream": upstream,
        "l4_connections": l4,
        "l7_connections": protocols,  # by protocol: {"h1": n, "h2": n}
        "h2_refusals": h2_refusals,  # reason -> count, non-zero only
    }
