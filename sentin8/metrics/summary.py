"""Per-service totals as plain data, for the management API's /stats and the dashboard (issue #10).

Same source as the exposition (live + retired blocks), shaped like the fleet-wide figures there: per service
``requests``, ``status_1xx``..``status_5xx`` (+ ``status_other``), ``latency_buckets_ms`` as [upper bound in ms
or None for +Inf, count] pairs, ``latency_sum_ms``, the upstream counts, and the L4 path's ``l4_connections``
with ``l4_bytes_in``/``l4_bytes_out`` (client -> backend and back, counted as each pipe closes). Services with no
traffic are left out.
"""

from __future__ import annotations

from typing import Any

from ..shm import counters as c
from ..shm.state import SharedState
from .scales import LATENCY_BOUNDS_S, LATENCY_BUCKETS, STATUS_LABELS

_CLASS_OF_SLOT = [
    f"status_{label[0]}xx" if label[0] in "12345" and label != "other" else "status_other" for label in STATUS_LABELS
]
_BOUNDS_MS: list[float | None] = [*(round(b * 1000.0, 3) for b in LATENCY_BOUNDS_S), None]


def service_stats(shared: SharedState) -> dict[str, dict[str, Any]]:
    names = shared.service_names().names()
    words = shared.counter_reader().read(len(names))
    out: dict[str, dict[str, Any]] = {}
    for sidx, service in enumerate(names):
        row = c.MAX_COUNTERS + sidx * c.SERVICE_WORDS
        statuses = words[row + c.S_STATUS : row + c.S_STATUS + len(STATUS_LABELS)]
        buckets = words[row + c.S_LATENCY : row + c.S_LATENCY + LATENCY_BUCKETS]
        l4 = words[row + c.S_L4]
        upstream = {kind: words[row + off] for kind, off in c.UPSTREAM_KINDS.items()}
        if not any(statuses) and not l4 and not any(upstream.values()):
            continue
        entry: dict[str, Any] = {"requests": sum(statuses)}
        for cls in ("status_1xx", "status_2xx", "status_3xx", "status_4xx", "status_5xx", "status_other"):
            entry[cls] = 0
        for slot, n in enumerate(statuses):
            entry[_CLASS_OF_SLOT[slot]] += n
        entry["by_status"] = {STATUS_LABELS[slot]: n for slot, n in enumerate(statuses) if n}
        entry["latency_buckets_ms"] = [[bound, n] for bound, n in zip(_BOUNDS_MS, buckets, strict=True)]
        entry["latency_sum_ms"] = round(words[row + c.S_LAT_SUM_US] / 1000.0, 3)
        entry["upstream"] = upstream
        entry["l4_connections"] = l4
        entry["l4_bytes_in"] = words[row + c.S_L4_BYTES_IN]  # client -> backend, counted when a pipe closes
        entry["l4_bytes_out"] = words[row + c.S_L4_BYTES_OUT]
        out[service] = entry
    return out
