"""The routing table: hostnames -> context, services -> instances. Sans-IO.

The resolver builds a ``RoutingTable`` from its sources and publishes it (msgpack) through shared memory;
every worker decodes it and answers ``resolve(hostname)`` per connection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import msgspec


class Instance(msgspec.Struct, frozen=True, array_like=True):
    """One backend instance of a service (a ``captain:svc:<service>`` hash field, or a file entry)."""

    id: str
    service: str
    host: str
    port: int
    state: str = "Active"
    health_ts: float | None = None  # None = no heartbeat contract (file instances): always fresh
    tls: bool = False
    proxy_protocol: str = ""  # "v2": an L4 pipe to it starts with a PROXY v2 header; "" = none


class Route(msgspec.Struct, frozen=True, array_like=True):
    """What a hostname resolves to: the service that answers it and the tenant context to inject."""

    hostname: str
    service: str
    env_id: str = ""
    app_id: str = ""
    org_id: str = ""
    sidx: int = 0  # the service's metrics index (sentin8.shm.services), set by the resolver at publish


class RoutingTable(msgspec.Struct, array_like=True):
    built_at: float = 0.0  # wall clock of the last successful load of every source
    stale: bool = False  # a source failed after a good load: this is the last good data
    routes: dict[str, Route] = {}  # exact hostnames, lower case; "*.example.com" keys hold wildcards
    services: dict[str, list[Instance]] = {}
    # The registry's health clock (see ``health_clock``): while the registry cannot be read, heartbeats are
    # judged at the moment of its last good read (``health_frozen_at``, 0 = live); once it is back, for one
    # freshness window, they are judged ``health_lag_s`` behind wall time (the paused clock resumes), so an
    # instance that was only "stale" because nobody could read its heartbeat is not dropped before Captain
    # writes the next one.
    health_frozen_at: float = 0.0
    health_lag_s: float = 0.0
    health_lag_until: float = 0.0
    service_ids: dict[str, int] = {}  # every service's metrics index, for paths without a Route (ACME)

    def health_clock(self, now: float) -> float:
        """The time against which ``health_ts`` freshness is judged at wall time ``now``."""
        if self.health_frozen_at:
            return min(now, self.health_frozen_at)
        if now < self.health_lag_until:
            return now - self.health_lag_s
        return now

    def resolve(self, hostname: str) -> Route | None:
        """Exact name first, then a one-label wildcard (``*.example.com`` answers ``a.example.com`` only)."""
        return _resolve_in(self.routes, hostname)

    def instances(self, service: str) -> list[Instance]:
        return _instances_in(self.services, service)

    def service_id(self, service: str) -> int:
        """The metrics index of ``service``: ``_other`` (1) for one the resolver did not index."""
        return self.service_ids.get(service, 1)

    def with_service_ids(self, assign: Callable[[Iterable[str]], dict[str, int]], extra: Iterable[str] = ()) -> None:
        """Give every service (of routes, instances and ``extra``) its metrics index, in place: ``assign`` is
        ``ServiceNames.assign``, which keeps an index for the fleet's life. Routes carry their index so a
        worker counts with no lookup; the resolver calls this once per publication."""
        names = sorted({r.service for r in self.routes.values()} | set(self.services) | set(extra))
        self.service_ids = assign(names)
        ids = self.service_ids
        self.routes = {
            host: r if r.sidx == ids[r.service] else msgspec.structs.replace(r, sidx=ids[r.service])
            for host, r in self.routes.items()
        }


def _resolve_in(routes: dict[str, Route], hostname: str) -> Route | None:
    """``RoutingTable.resolve``, outside the msgspec class so that routing.pxd can type its dict and name (the
    lookups are C calls once compiled, not methods found by name)."""
    name = hostname.lower().rstrip(".")
    route = routes.get(name)
    if route is not None:
        return route
    dot = name.find(".")
    if dot > 0:
        return routes.get("*" + name[dot:])
    return None


def _instances_in(services: dict[str, list[Instance]], service: str) -> list[Instance]:
    got = services.get(service)
    return got if got is not None else []  # a new list only for a service without instances


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(RoutingTable)


def encode(table: RoutingTable) -> bytes:
    return _encoder.encode(table)


def decode(data: bytes | memoryview) -> RoutingTable:
    return _decoder.decode(data)


def build(routes: list[Route], instances: list[Instance], built_at: float, stale: bool = False) -> RoutingTable:
    services: dict[str, list[Instance]] = {}
    for inst in sorted(instances, key=lambda i: (i.service, i.id)):
        services.setdefault(inst.service, []).append(inst)
    by_name: dict[str, Route] = {}
    for route in routes:
        by_name.setdefault(route.hostname.lower().rstrip("."), route)
    return RoutingTable(built_at=built_at, stale=stale, routes=by_name, services=services)
