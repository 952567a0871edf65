"""What a worker gives every L7 bridge: routing, selection, suspects, counters, policy and upstream TLS."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sentin8 import tls
from sentin8.config import Config
from sentin8.policy import EdgePolicy
from sentin8.routing import Instance, Route

from .access_log import AccessLog
from .l7_bridge import RequestInfo, _Exchange
from .tls_layer import TLSClientProtocol
from .upstream import UpstreamPool

# EdgePolicy verdict counters -> policy-block kinds (sentin8.shm.counters.POLICY_KINDS)
POLICY_KIND = {"policy_rate_limit": "rate_limit", "policy_waf": "waf"}

if TYPE_CHECKING:
    from .worker import Worker


class WorkerL7Context:
    def __init__(self, worker: Worker, loop: asyncio.AbstractEventLoop, policy: EdgePolicy) -> None:
        self.worker = worker
        self.cfg: Config = worker.cfg
        self.counters = worker.counters
        self.edge_policy = policy
        self.policy_values = worker.policy_values
        self.pool = UpstreamPool.from_config(loop, self.cfg)
        up = self.cfg.upstream
        self._upstream_ctx = None
        self._upstream_opts = {"ca_file": up.ca_file, "client_cert": up.client_cert, "client_key": up.client_key}
        self.access_log = AccessLog(worker.index) if self.cfg.log.access else None

    def resolve(self, host: str) -> Route | None:
        table = self.worker.routes.current()
        return table.resolve(host) if table is not None else None

    def candidates(self, service: str) -> list[Instance]:
        return self.worker.candidates(service)

    def mark_suspect(self, instance_id: str) -> None:
        self.counters.inc("backend_connect_errors")
        self.worker.selector.mark_suspect(instance_id, time.time())

    def count(self, name: str, n: int = 1) -> None:
        self.counters.inc(name, n)

    def service_id(self, service: str) -> int:
        table = self.worker.routes.current()
        return table.service_id(service) if table is not None else 0

    def upstream(self, sidx: int, name: str) -> None:
        self.counters.upstream(sidx, name)

    def request_done(self, ex: _Exchange, seconds: float) -> None:
        """An answered request: per-service status and latency, traffic side, header caps, access log."""
        counters = self.counters
        status = ex.status
        counters.request(ex.sidx, status, seconds)
        counters.traffic(ex.bridge.external, "requests")
        if status == 431:
            counters.policy_block("header_caps")
        if self.access_log is not None:
            self.access_log.write(ex, seconds)

    def inflight(self, delta: int) -> None:
        self.counters.add_gauge("active_connections", delta)

    def policy(self, request: RequestInfo) -> int | None:
        values = self.policy_values.current()  # one shared read; a new object only after a runtime change
        if values is not self.edge_policy.cfg:
            self.edge_policy.cfg = values  # EdgePolicy reads its values from .cfg at decision time
        verdict = self.edge_policy.check(request.client_ip, request.host, request.target)
        if verdict is None:
            return None
        status, counter = verdict
        self.counters.inc(counter)
        self.counters.policy_block(POLICY_KIND.get(counter, "other"))
        return status

    def upstream_tls(self, instance: Instance) -> Callable[[asyncio.Protocol], asyncio.Protocol] | None:
        """Bridge mode for ``tls = true`` instances: TLS (mTLS when a client cert is configured) to the backend."""
        if not instance.tls:
            return None
        if self._upstream_ctx is None:
            self._upstream_ctx = tls.upstream_context(**self._upstream_opts)
        ctx = self._upstream_ctx
        verify = instance.host if self.cfg.upstream.ca_file else None

        def wrap(inner: asyncio.Protocol) -> asyncio.Protocol:
            return TLSClientProtocol(
                ctx,
                lambda: inner,
                verify_name=verify,
                handshake_timeout=self.cfg.upstream.connect_timeout_s,
                on_handshake_error=lambda reason: self.counters.inc("upstream_errors"),
            )

        return wrap
