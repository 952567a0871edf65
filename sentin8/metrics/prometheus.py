"""Prometheus exposition of the fleet's shared counters for the management port's ``GET /metrics``.

PLACEHOLDER (issue #10): the minimum the management API needs to call. Issue #9 owns this module and replaces
it with the full metric set; the signature below is the contract between the two.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.exposition import choose_encoder

from ..shm.state import SharedState


def exposition(shared: SharedState, accept: str | None = None) -> tuple[bytes, str]:
    """(body, content type) for the client's Accept header."""
    registry = CollectorRegistry(auto_describe=False)
    gauge = Gauge("sentin8_active_connections", "L7 requests in flight (the drain signal)", registry=registry)
    gauge.set(shared.counter_reader().total()["active_connections"])
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type
