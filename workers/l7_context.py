"""What a worker gives every L7 bridge: routing and backends, counters, policy and upstream TLS."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from OpenSSL import SSL

from sentin8 import tls
from sentin8.backends import Backends
from sentin8.config import Config, Upstream
from sentin8.policy import EdgePolicy, Verdict
from sentin8.refusals import Refusal
from sentin8.routing import Instance, Route
from sentin8.shm.counters import WorkerCounters
from sentin8.shm.policy import PolicyCache

from .access_log import AccessLog
from .l7.contract import L7Context, RequestInfo
from .l7.exchange import Exchange
from .tls_client import TLSClientProtocol
from .upstream import UpstreamPool
from .waf_gate import WafGate


class WorkerL7Context(L7Context):
    """The ``L7Context`` of a worker: one per process, shared by all its bridges. Compiled, a ``cdef``
    subclass (``l7_context.pxd``): its counters typed, its methods C overrides of the base's."""

    def __init__(
        self,
        cfg: Config,
        loop: asyncio.AbstractEventLoop,
        counters: WorkerCounters,
        backends: Backends,
        policy: EdgePolicy,
        policy_values: PolicyCache,
        worker_index: int = 0,
    ) -> None:
        self.cfg = cfg
        self.counters = counters
        self.backends = backends
        self.edge_policy = policy
        self.policy_values = policy_values
        self.pool = UpstreamPool.from_config(loop, cfg)
        self.gate = WafGate(loop, policy, counters.inc)
        self.inflight_now = 0  # this worker's L7 requests in flight (the gauge's local twin, for the cap)
        self.inflight_cap = cfg.limits.max_inflight_per_worker  # 0: no cap
        self._upstream_tls = UpstreamTLS(cfg.upstream, counters.inc)
        self.access_log = AccessLog(worker_index) if cfg.log.access else None

    def resolve(self, host: str) -> Route | None:
        return self.backends.resolve(host)

    def candidates(self, service: str) -> list[Instance]:
        return self.backends.candidates(service)

    def backend_failed(self, instance: Instance) -> None:
        self.backends.failed(instance)

    def upstream_result(self, instance_id: str, ok: bool) -> None:
        self.backends.result(instance_id, ok)

    def count(self, name: str, n: int = 1) -> None:
        self.counters.inc(name, n)

    def refused(self, refusal: Refusal) -> None:
        self.counters.refused(refusal)  # counted as sentin8.refusals decides

    def upstream(self, sidx: int, name: str) -> None:
        self.counters.upstream(sidx, name)

    def overloaded(self) -> bool:
        cap = self.inflight_cap
        return cap > 0 and self.inflight_now > cap

    def service_id(self, service: str) -> int:
        table = self.backends.table()
        return table.service_id(service) if table is not None else 0

    def request_done(self, ex: Exchange, seconds: float) -> None:
        """An answered request: per-service status and latency, traffic side, access log."""
        counters = self.counters
        exchange = ex  # typed in l7_context.pxd, as ``info`` in policy: its fields are C struct reads
        counters.request(exchange.sidx, exchange.status, seconds)
        counters.traffic(exchange.client.facts.external, "requests")
        if self.access_log is not None:
            self.access_log.write(ex, seconds)

    def inflight(self, delta: int) -> None:
        self.inflight_now += delta
        self.counters.add_gauge("active_connections", delta)

    def policy(self, request: RequestInfo) -> Verdict | None:
        values = self.policy_values.current()  # one shared read; a new object only after a runtime change
        if values is not self.edge_policy.cfg:
            self.edge_policy.cfg = values  # EdgePolicy reads its values from .cfg at decision time
        info = request
        return self.edge_policy.check(info.client_ip, info.host, info.target)  # the bridge counts it

    def waf_gate(self) -> WafGate:
        return self.gate

    def upstream_tls(self, instance: Instance) -> Callable[[asyncio.Protocol], asyncio.Protocol] | None:
        return self._upstream_tls.for_instance(instance)


class UpstreamTLS:
    """Bridge mode for ``tls = true`` instances: TLS (mTLS when a client cert is configured) to the backend.

    The instance's host is sent as SNI (a backend serving several names picks its certificate by it; IP
    literals are not sent, as RFC 6066 requires), and with ``upstream.ca_file`` set the backend's certificate
    must also name that host: a valid chain for some other name is refused. The client context is built on
    first use (a worker without TLS backends never loads the files)."""

    def __init__(self, upstream: Upstream, count: Callable[[str], None]) -> None:
        self._upstream = upstream
        self._count = count
        self._ctx: SSL.Context | None = None

    def for_instance(self, instance: Instance) -> Callable[[asyncio.Protocol], asyncio.Protocol] | None:
        if not instance.tls:
            return None
        up = self._upstream
        if self._ctx is None:
            self._ctx = tls.upstream_context(ca_file=up.ca_file, client_cert=up.client_cert, client_key=up.client_key)
        ctx = self._ctx
        name = instance.host
        verify = name if up.ca_file else None
        timeout = up.connect_timeout_s
        count = self._count

        def wrap(inner: asyncio.Protocol) -> asyncio.Protocol:
            return TLSClientProtocol(
                ctx,
                lambda: inner,
                server_hostname=name,
                verify_name=verify,
                handshake_timeout=timeout,
                on_handshake_error=lambda reason: count("upstream_errors"),
            )

        return wrap
