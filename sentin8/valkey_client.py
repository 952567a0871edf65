"""One place that turns a ``ValkeyTarget`` (``sources.valkey_mode`` and friends) into an async redis-py client.

Every Valkey user goes through ``connect``: the registry scan and the change subscription (``sources.live``), the
``stat:metrics`` publisher, the cluster limiter's syncer and the runtime-policy document. What they get behaves
the same in every mode for what they do:

- **single**: ``Redis.from_url(valkey_url)``.
- **sentinel**: ``Sentinel(valkey_nodes).master_for(sentinel_master)``: each new connection asks the sentinels
  who the master is, and a connection to a demoted master fails (read-only reply or reset), so a failover costs
  the caller one failed call, after which its retry reaches the new master. The URL's scheme, credentials and
  database apply to the master; the sentinels are asked with the timeouts only (no password).
- **cluster**: ``RedisCluster(startup_nodes=valkey_nodes)``: keys are routed by slot, ``SCAN`` runs on every
  master, pipelines split by node, scripts go to the node of their first key (every script's keys share one hash
  tag), ``pubsub()`` subscribes on the node of the channel's slot, and a plain ``PUBLISH`` reaches every node of a
  cluster, so publishers and subscribers need not meet on one node. redis-py caps connections per node (100).

Callers own retries (no client-side retry, so an outage shows at once), except that a cluster client may follow a
redirection (``MOVED`` after a slot moved) twice before it gives up. Close with ``close``: a Sentinel client also
holds connections to the sentinels.
"""

from __future__ import annotations

import contextlib
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.connection import parse_url

from .config import ValkeyTarget

CLUSTER_REDIRECTS = 2  # MOVED/ASK followed per call; a connection error counts too, so keep it small


def split_node(node: str) -> tuple[str, int]:
    """``"host:port"`` / ``"[v6]:port"`` -> (host, port); the config check has already refused anything else."""
    host, _, port = node.rpartition(":")
    return host.strip("[]"), int(port)


def _url_options(url: str) -> dict[str, Any]:
    """What of the URL applies to every node: scheme (TLS), credentials, database; its host is replaced."""
    opts = dict(parse_url(url))
    for key in ("host", "port", "path", "connection_class"):
        opts.pop(key, None)
    if url.startswith("rediss://"):
        opts["ssl"] = True
    return opts


def connect(target: ValkeyTarget, *, connect_timeout_s: float, timeout_s: float, **options: Any) -> Any:
    """A client for ``target``; ``options`` are connection options (health checks, keepalive)."""
    common: dict[str, Any] = {
        "socket_connect_timeout": connect_timeout_s,
        "socket_timeout": timeout_s,
        **options,
    }
    if target.mode == "single":
        return aioredis.Redis.from_url(target.url, retry=Retry(NoBackoff(), 0), **common)
    opts = _url_options(target.url)
    nodes = [split_node(n) for n in target.nodes]
    if target.mode == "cluster":
        opts.pop("db", None)  # a cluster has database 0 only (the config check refuses another)
        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in nodes],
            retry=Retry(NoBackoff(), CLUSTER_REDIRECTS),
            **opts,
            **common,
        )
    if target.mode == "sentinel":
        sentinel = Sentinel(
            nodes,
            sentinel_kwargs={"socket_connect_timeout": connect_timeout_s, "socket_timeout": timeout_s},
            retry=Retry(NoBackoff(), 0),
            **opts,
            **common,
        )
        return sentinel.master_for(target.master)
    raise ValueError(f"unknown valkey mode {target.mode!r}")


async def close(client: Any) -> None:
    """Close ``client`` and, behind Sentinel, its connections to the sentinels; never raises (a dead connection
    may fail to close, and there is nothing left to do about it)."""
    if client is None:
        return
    with contextlib.suppress(Exception):
        await client.aclose()
    pool = getattr(client, "connection_pool", None)
    if isinstance(pool, SentinelConnectionPool):
        for s in pool.sentinel_manager.sentinels:
            with contextlib.suppress(Exception):
                await s.aclose()
