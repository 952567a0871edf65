"""What a worker gives every L7 bridge: routing, selection, suspects, counters, policy and upstream TLS."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sentin8 import tls
from sentin8.config import Config
from sentin8.policy import EdgePolicy, Verdict
from sentin8.routing import Instance, Route

from .access_log import AccessLog
from .l7_bridge import RequestInfo, _Exchange
from .tls_layer import TLSClientProtocol
from .upstream import UpstreamPool
from .waf_gate import WafGate

# Refusal counters -> policy-block kinds (sentin8.shm.counters.POLICY_KINDS); 431s are counted at request_done
POLICY_KIND = {"policy_rate_limit": "rate_limit", "policy_waf": "waf", "refused_inflight": "inflight_cap"}

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
        self.gate = WafGate(loop, policy, self.counters.inc)
        self.inflight_now = 0  # this worker's L7 requests in flight (the gauge's local twin, for the cap)
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
        self.worker.upstream_result(instance_id, False)

    def upstream_result(self, instance_id: str, ok: bool) -> None:
        self.worker.upstream_result(instance_id, ok)

    def overloaded(self) -> bool:
        cap = self.cfg.limits.max_inflight_per_worker
        return bool(cap) and self.inflight_now > cap

    def count(self, name: str, n: int = 1) -> None:
        self.counters.inc(name, n)
        kind = POLICY_KIND.get(name)  # the bridge's refusals by name are policy blocks by kind too
        if kind is not None:
            self.counters.policy_block(kind)

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
        self.inflight_now += delta
        self.counters.add_gauge("active_connections", delta)

    def policy(self, request: RequestInfo) -> Verdict | None:
        values = self.policy_values.current()  # one shared read; a new object only after a runtime change
        if values is not self.edge_policy.cfg:
            self.edge_policy.cfg = values  # EdgePolicy reads its values from .cfg at decision time
        verdict = self.edge_policy.check(request.client_ip, request.host, request.target)
        if verdict is not None:
            self.count(verdict.counter)
        return verdict

    def waf_gate(self) -> WafGate:
        return self.gate

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
