"""The optional access log (``[log] access = true``): one JSON line per answered L7 request on stderr.

Fields: method, status, service, duration_ms, bytes_in (request body bytes sent upstream), bytes_out (response
body bytes), correlation_id (the one sent upstream: the client's X-Correlation-Id when well-formed, else a
generated one), instance (the upstream instance id), worker. Never the path, the query, a header value or a
body byte: an access log is shipped to places that must not hold tenant data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sentin8.eventlog import event

if TYPE_CHECKING:
    from .l7 import Exchange


class AccessLog:
    def __init__(self, worker: int) -> None:
        self.worker = worker

    def write(self, ex: Exchange, seconds: float) -> None:
        head = ex.req.head
        event(
            "access",
            "info",
            method=head.method.decode("ascii", "replace") if head is not None else "",
            status=ex.status,
            service=ex.service,
            duration_ms=round(seconds * 1000.0, 3),
            bytes_in=ex.body_written,
            bytes_out=ex.resp_body_bytes,
            correlation_id=ex.corr.decode("ascii", "replace"),
            instance=ex.instance.id if ex.instance is not None else "",
            worker=self.worker,
        )
