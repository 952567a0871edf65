"""What the L7 package needs from the worker that hosts it (``L7Context``) and what a policy sees of a request
(``RequestInfo``). ``workers/l7_context.py`` implements the context for a worker; the tests give their own."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sentin8.config import Config
from sentin8.http.headers import Header
from sentin8.policy import Verdict
from sentin8.refusals import Refusal
from sentin8.routing import Instance, Route

if TYPE_CHECKING:
    from workers.upstream import UpstreamPool
    from workers.waf_gate import WafGate

    from .exchange import Exchange


class RequestInfo:
    """What the policy hook sees (rate limit, WAF). ``headers`` are as received, before hygiene."""

    __slots__ = ("client_ip", "headers", "host", "method", "path", "route", "scheme", "target")

    def __init__(
        self,
        method: bytes,
        target: bytes,
        path: bytes,
        host: str,
        client_ip: str,
        route: Route,
        headers: list[Header],
        scheme: str,
    ) -> None:
        self.method = method
        self.target = target
        self.path = path
        self.host = host
        self.client_ip = client_ip
        self.route = route
        self.headers = headers
        self.scheme = scheme


class L7Context:
    """What the worker provides to every client connection: one per worker, shared by all of them.

    A base class rather than a Protocol so that, compiled, it is a ``cdef`` class (``contract.pxd``): the
    bridges, the streams, admission and the exchange hold their context typed, and every call below is a C
    call, not an attribute lookup and a Python call (a request makes a dozen). ``workers/l7_context.py`` is
    the worker's context; the tests subclass this one. A method left as it is here raises: a context gives
    every one the L7 package may ask for."""

    cfg: Config
    pool: UpstreamPool  # one per worker: UpstreamPool.from_config(loop, cfg)

    def resolve(self, host: str) -> Route | None:
        raise NotImplementedError

    def candidates(self, service: str) -> list[Instance]:  # ordered, healthy first
        raise NotImplementedError

    def backend_failed(self, instance: Instance) -> None:  # unreachable: suspect for every worker, counted
        raise NotImplementedError

    def count(self, name: str, n: int = 1) -> None:
        raise NotImplementedError

    def refused(self, refusal: Refusal) -> None:  # counted as sentin8.refusals decides (policy blocks too)
        raise NotImplementedError

    def service_id(self, service: str) -> int:  # metrics index of a service with no Route (ACME)
        raise NotImplementedError

    def upstream(self, sidx: int, name: str) -> None:  # upstream_warm | upstream_cold | upstream_stale_retry
        raise NotImplementedError

    def request_done(self, ex: Exchange, seconds: float) -> None:  # answered: status, timing, access log
        raise NotImplementedError

    def inflight(self, delta: int) -> None:
        raise NotImplementedError

    def policy(self, request: RequestInfo) -> Verdict | int | None:  # a refusal (429, 403...) to count, or None
        raise NotImplementedError

    def upstream_tls(self, instance: Instance) -> object | None:  # SSLContext or wrap(inner) -> Protocol
        raise NotImplementedError

    def waf_gate(self) -> WafGate | None:  # where inspections run; None: no WAF in this context
        raise NotImplementedError

    def upstream_result(self, instance_id: str, ok: bool) -> None:  # for the instance's circuit breaker
        raise NotImplementedError

    def overloaded(self) -> bool:  # over the worker's in-flight request cap
        raise NotImplementedError
