"""What a resolver knows before it has loaded anything: the last-known routing table, split per source. Sans-IO.

A resolver is one process among several; the routing table it published lives on in shared memory when it dies
(crash, SIGKILL, or the restart a ``[sources]`` reload causes), and the last complete one lives on disk when
the whole fleet stops (``sentin8.routing_cache``). A new resolver starts from that table rather than from
nothing, so it never publishes a table built from less than the fleet was serving:

- each source's part is kept apart: the **registry part** (the instances, from Valkey) and the **domains part**
  (the hostnames, from PostgreSQL). A source that loads replaces its own part; one that cannot keeps the
  last-known part, and the table is marked stale until every live source has loaded in this process;
- the registry part carries the moment it was read (``registry_read_at``): heartbeats cannot age while nobody
  reads them, so the health clock stays frozen there until the registry is read again (``RoutingTable
  .health_clock``), exactly as during an outage of a running resolver.

Which part a source contributes is decided by the runner (``sentin8.sources.live``): a part is replaced only by a
successful load of its own source, never by an empty default.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..routing import Instance, Route, RoutingTable

PUBLISHED = "published"  # the table in shared memory: the resolver restarted, the fleet kept serving
DISK = "disk"  # the cache file in tls.state_dir: the whole fleet (re)started


@dataclass(frozen=True)
class LastKnown:
    origin: str  # PUBLISHED | DISK
    instances: list[Instance]  # the registry part
    routes: list[Route]  # the domains part
    built_at: float  # the last moment every source had loaded fine (the table's age in /health)
    registry_read_at: float  # when the registry part was last read: the health clock while it is not read

    def describe(self) -> dict[str, object]:
        """Plain data for the log line that says where the resolver started from."""
        return {
            "origin": self.origin,
            "routes": len(self.routes),
            "instances": len(self.instances),
            "built_at": self.built_at,
            "registry_read_at": self.registry_read_at,
        }


def registry_read_at(table: RoutingTable, published_at: float) -> float:
    """When the table's registry part was last read, for the health clock.

    A table published while the registry was down says so (``health_frozen_at``). Otherwise the newest
    heartbeat in it is the best lower bound of its read (Captain writes heartbeats every few seconds, and a
    heartbeat cannot be newer than the read that saw it): judged there, every instance that was fresh at the
    read is still fresh, none that was stale becomes fresh. Without heartbeats (file instances) the moment of
    publication is as good as any."""
    if table.health_frozen_at:
        return table.health_frozen_at
    beats = [i.health_ts for insts in table.services.values() for i in insts if i.health_ts is not None]
    return max(beats) if beats else published_at


def from_table(table: RoutingTable, origin: str, published_at: float) -> LastKnown:
    """Split a published (or cached) table back into its sources' parts."""
    instances = [inst for insts in table.services.values() for inst in insts]
    instances.sort(key=lambda i: (i.service, i.id))
    routes = sorted(table.routes.values(), key=lambda r: r.hostname)
    return LastKnown(
        origin=origin,
        instances=instances,
        routes=routes,
        built_at=table.built_at,
        registry_read_at=registry_read_at(table, published_at),
    )
