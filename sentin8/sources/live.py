"""The live source runner: Valkey registry and/or PostgreSQL domains (either may be the file instead).

Lifecycle (ARCHITECTURE.md §6):

- **Boot**: a runner given the last-known table (``seed``: the one in shared memory when the resolver
  restarts, else the cache on disk at a cold start; ``sentin8.sources.lastknown``) starts from its parts: one
  attempt per live source, then the table is published at once, each source that could not load keeping its
  last-known part, marked stale. Without one, the first load of each live source is retried ``boot_retries`` x
  ``boot_retry_interval_s``; then whatever is known is published (possibly empty, marked stale) so the fleet
  can start. Either way the failing sources keep retrying in the background.
- **Events** (Valkey pub/sub): ``captain:changed`` -> registry reload, debounced (a burst costs one reload);
  ``sentin8:sys:domain:changed`` -> domain reload, newest wins (a pending flag, never a queue).
- **Safety poll** every ``poll_interval_s`` for both, and SIGHUP (``reload``) reloads both at once.
- **Standby lag**: the domain event comes over Valkey, not from PostgreSQL (LISTEN/NOTIFY would not reach a
  standby anyway), so when the domains are read from a hot standby the reload it triggers may run before the
  standby has replayed the change. An event-driven domain load served by a standby is therefore re-read
  ``STANDBY_RECHECK_S`` later (each delay once, not a loop), and the safety poll covers any longer lag.
- **Health refresh**: the registry is also re-read every ``health_refresh_s`` (< ``health_fresh_s``), since
  heartbeats are not announced; the table is republished only when something in it changed.
- **Outage**: a failed load keeps the last good data and republishes it with ``stale=True``; ``built_at``
  stays at the last moment every source was good, so the age shows. Failing loads and the subscription
  retry with exponential backoff capped at ``backoff_max_s`` (2 s: a recovered Valkey is read within ~2 s),
  without the event debounce; the first successful load clears ``stale``.
- **Health clock during a registry outage**: heartbeats cannot be read, so they must not age. The table
  carries ``health_frozen_at`` (the last good registry read) while the registry is down, and after it is
  back ``health_lag_s`` (the outage length) for one ``health_fresh_s`` window, so instances that were fresh
  at the last good read keep traffic until Captain has had a window to refresh them. After every
  (re)subscription both sources reload once, because events sent while unsubscribed are lost. A lost
  subscription alone never marks the table stale (the catch-up reload and the safety poll cover the
  missed events); with a Valkey registry it triggers an immediate registry load, which is what notices.
- A table is published only when its content changed (encoded bytes) or the stale flag flipped.

Each source has one loader task that owns its loads, so two loads of one source never overlap; events and
polls only set the loader's ``want`` flag.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from typing import Any

from .. import valkey_client
from ..config import Config
from ..eventlog import event
from ..routing import Instance, Route, RoutingTable, build, encode
from . import Publish
from .domains import CHANGED_CHANNEL as DOMAIN_CHANNEL
from .domains import PostgresDomains
from .files import file_instances, file_routes
from .lastknown import LastKnown
from .registry import CHANGED_CHANNEL as REGISTRY_CHANNEL
from .registry import fetch_registry

# An idle subscription to a vanished peer is noticed by keepalive in ~45 s; TCP_USER_TIMEOUT bounds the
# health-check PING of a half-open one, which would otherwise wait out TCP retransmission (~15 min). Linux.
_KEEPALIVE = {
    socket.TCP_KEEPIDLE: 30,
    socket.TCP_KEEPINTVL: 5,
    socket.TCP_KEEPCNT: 3,
    socket.TCP_USER_TIMEOUT: 45_000,
}


STANDBY_RECHECK_S = (1.0, 5.0)  # re-reads after an event-driven domain load that a standby served


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class _SourceState:
    """Bookkeeping of one source, also what ``status()`` reports."""

    def __init__(self, name: str, kind: str, debounce_s: float) -> None:
        self.name = name
        self.kind = kind
        self.live = kind != "file"
        self.debounce_s = debounce_s
        self.want = asyncio.Event()  # set = a reload is due; many requests, one reload
        self.busy = False  # the loader is debouncing, loading or backing off
        self.ok = not self.live  # the last attempt succeeded (a file source cannot fail)
        self.last_success: float | None = time.time() if not self.live else None
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.reloads = 0  # successful loads
        self.failures = 0
        self.requests = 0  # reload requests: events, polls, retries, SIGHUP
        self.details: dict[str, Any] = {}  # malformed entries, skipped hostnames, conflicts
        self.by_event = False  # a change event asked for the pending load

    def request(self, by_event: bool = False) -> None:
        if self.live:
            self.requests += 1
            self.by_event = self.by_event or by_event
            self.want.set()

    def snapshot(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "ok": self.ok,
            "last_success": self.last_success,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "reloads": self.reloads,
            "failures": self.failures,
            "requests": self.requests,
            "pending": self.want.is_set() or self.busy,
            **self.details,
        }


class LiveRunner:
    """``SourceRunner`` for any mix of registry (valkey | file) and domains (postgres | file)."""

    def __init__(
        self,
        cfg: Config,
        *,
        registry_debounce_s: float = 1.0,
        domains_debounce_s: float = 0.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 2.0,
        load_timeout_s: float = 15.0,
        connect_timeout_s: float = 5.0,
        ping_interval_s: float = 10.0,
        seed: LastKnown | None = None,
    ) -> None:
        src = cfg.sources
        self.cfg = cfg
        self.registry_debounce_s = registry_debounce_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.load_timeout_s = load_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.ping_interval_s = ping_interval_s
        self.registry = _SourceState("registry", src.registry, registry_debounce_s)
        self.domains = _SourceState("domains", src.domains, domains_debounce_s)
        self._sources = (self.registry, self.domains)
        self._instances: list[Instance] = [] if self.registry.live else file_instances(cfg)
        self._routes: list[Route] = [] if self.domains.live else file_routes(cfg)
        self._valkey: Any = None  # redis-py's Redis or RedisCluster (sources.valkey_mode)
        self._postgres = (
            PostgresDomains(src.postgres_dsn, src.apps_domain, connect_timeout_s=int(connect_timeout_s))
            if self.domains.live
            else None
        )
        # The MemBus carries domain events too, so Postgres domains need Valkey even with a file registry.
        self._subscribe = self.registry.live or self.domains.live
        self._sub: dict[str, Any] = {
            "enabled": self._subscribe,
            "connected": False,
            "connects": 0,
            "last_error": None,
            "last_error_at": None,
            "events": {REGISTRY_CHANNEL: 0, DOMAIN_CHANNEL: 0},
        }
        self._publish: Publish | None = None  # None until boot is over: nothing is published before
        self._published_key: bytes | None = None
        self._published_stale = False
        self._published_clock: tuple[float, float, float] = (0.0, 0.0, 0.0)
        self._health_lag = (0.0, 0.0)  # (lag_s, until): the registry's paused clock resuming after an outage
        self._published = 0
        self._last_publish_at: float | None = None
        self._publish_error: str | None = None
        self._good_at = 0.0  # last moment every source had just loaded fine: the published built_at
        self._handing_over = False  # stopping: the registry will go unread until the successor reads it
        self.seed = seed
        if seed is not None:
            self._start_from(seed)

    def _start_from(self, seed: LastKnown) -> None:
        """Each live source starts with its last-known part (a file source has its own, always current); a
        part is replaced only by a load of its own source (``_load``), so nothing published is ever built
        from less than this. ``last_success`` is when that data was read, by whichever resolver read it: the
        health clock freezes there while the registry cannot be read, and resumes from there once it is."""
        if self.registry.live:
            self._instances = list(seed.instances)
            self.registry.last_success = seed.registry_read_at or None
        if self.domains.live:
            self._routes = list(seed.routes)
            self.domains.last_success = seed.built_at or None
        self._good_at = seed.built_at

    # ---- status ---------------------------------------------------------------------------------------

    @property
    def stale(self) -> bool:
        return not all(s.ok for s in self._sources)

    def status(self) -> dict[str, Any]:
        """Plain data for /health and logs: no secrets (DSNs and URLs are not included)."""
        return {
            "stale": self.stale,
            "built_at": self._good_at,
            "published": self._published,
            "last_publish_at": self._last_publish_at,
            "publish_error": self._publish_error,
            "started_from": self.seed.origin if self.seed is not None else None,
            "instances": len(self._instances),
            "routes": len(self._routes),
            "registry": self.registry.snapshot(),
            "domains": self.domains.snapshot(),
            "subscriber": {**self._sub, "events": dict(self._sub["events"])},
        }

    # ---- table ----------------------------------------------------------------------------------------

    def _rebuild(self) -> None:
        stale = self.stale
        if not stale:
            self._good_at = time.time()
        if self._publish is None:
            return
        table: RoutingTable = build(self._routes, self._instances, built_at=0.0, stale=False)
        key = encode(table)  # content only: an unchanged table must not be republished on every poll
        clock = self._health_clock_fields()
        if key == self._published_key and stale == self._published_stale and clock == self._published_clock:
            return
        table.built_at = self._good_at
        table.stale = stale
        table.health_frozen_at, table.health_lag_s, table.health_lag_until = clock
        try:
            self._publish(table)
        except Exception as exc:  # e.g. too large for shared memory: keep serving the last one, retry next time
            self._publish_error = _describe(exc)
            event("snapshot_publish_failed", "error", error=self._publish_error, action="the previous table stays")
            return
        self._publish_error = None
        self._published_key = key
        self._published_stale = stale
        self._published_clock = clock
        self._published += 1
        self._last_publish_at = time.time()

    def _health_clock_fields(self) -> tuple[float, float, float]:
        """(frozen_at, lag_s, lag_until) for the published table; see ``RoutingTable.health_clock``."""
        reg = self.registry
        if reg.live and (not reg.ok or self._handing_over) and reg.last_success:
            return (reg.last_success, 0.0, 0.0)
        lag_s, until = self._health_lag
        if until and time.time() < until:
            return (0.0, lag_s, until)
        return (0.0, 0.0, 0.0)

    # ---- loads ----------------------------------------------------------------------------------------

    def _valkey_client(self) -> Any:
        if self._valkey is None:
            # No client-side retries: this runner owns retry and backoff, and an outage must show at once.
            self._valkey = valkey_client.connect(
                self.cfg.sources_valkey(), connect_timeout_s=self.connect_timeout_s, timeout_s=self.load_timeout_s
            )
        return self._valkey

    async def _load(self, src: _SourceState) -> None:
        if src is self.registry:
            got = await fetch_registry(self._valkey_client())
            self._instances = got.instances
            src.details = {"malformed": got.malformed, "malformed_examples": got.errors[:5]}
        else:
            assert self._postgres is not None
            dom = await self._postgres.load()
            self._routes = dom.routes
            src.details = {
                "skipped": dom.skipped,
                "conflicts": dom.conflicts,
                "notes": dom.notes[:10],
                "standby": self._postgres.standby,
            }

    async def _attempt(self, src: _SourceState) -> bool:
        try:
            await asyncio.wait_for(self._load(src), self.load_timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if src.ok or src.failures == 0:  # log transitions, not every retry
                event(
                    "source_outage",
                    "warning",
                    source=src.name,
                    kind=src.kind,
                    error=_describe(exc),
                    action="serving the last good data as stale",
                )
            src.ok = False
            src.failures += 1
            src.last_error = _describe(exc)
            src.last_error_at = time.time()
            self._rebuild()
            return False
        if not src.ok and src.failures:
            event("source_recovered", source=src.name, kind=src.kind, failures=src.failures)
            if src is self.registry and src.last_success:
                now = time.time()
                self._health_lag = (now - src.last_success, now + self.cfg.sources.health_fresh_s)
        src.ok = True
        src.reloads += 1
        src.last_success = time.time()
        self._rebuild()
        return True

    async def _loader(self, src: _SourceState) -> None:
        backoff = self.backoff_initial_s
        retrying = False
        while True:
            if not retrying:
                src.busy = False
                await src.want.wait()
                src.busy = True
                if src.debounce_s > 0:
                    await asyncio.sleep(src.debounce_s)  # let the burst land: everything in it costs one load
            src.want.clear()  # requests from here on ask for a newer load than the one starting now
            by_event, src.by_event = src.by_event, False
            if await self._attempt(src):
                backoff = self.backoff_initial_s
                retrying = False
                if by_event and src is self.domains and self._postgres is not None and self._postgres.standby:
                    loop = asyncio.get_running_loop()
                    for delay in STANDBY_RECHECK_S:  # the standby may not have replayed the change yet
                        loop.call_later(delay, src.request)
                continue
            # A retry is not an event burst: no debounce, so a recovered source is read within the backoff.
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.backoff_max_s)
            src.requests += 1
            retrying = True

    def _request_all(self) -> None:
        for src in self._sources:
            src.request()

    async def _boot(self) -> None:
        live = [s for s in self._sources if s.live]
        # With a last-known table there is something better to serve than nothing: do not wait for the outage.
        retries = 0 if self.seed is not None else max(0, self.cfg.sources.boot_retries)
        for attempt in range(retries + 1):
            await asyncio.gather(*(self._attempt(s) for s in live))
            live = [s for s in live if not s.ok]
            if not live:
                return
            if attempt < retries:
                await asyncio.sleep(self.cfg.sources.boot_retry_interval_s)
        names = ", ".join(s.name for s in live)
        if self.seed is not None:
            action = f"keeping their last-known part ({self.seed.origin} table), marked stale"
        else:
            action = "starting with what is known, marked stale"
        event("source_boot_incomplete", "warning", sources=names, retries=retries, action=action)
        for src in live:
            src.request()  # the loaders keep trying, with backoff

    # ---- watchers -------------------------------------------------------------------------------------

    async def _subscriber(self) -> None:
        backoff = self.backoff_initial_s
        channels = {
            REGISTRY_CHANNEL.encode(): (REGISTRY_CHANNEL, self.registry),
            DOMAIN_CHANNEL.encode(): (DOMAIN_CHANNEL, self.domains),
        }
        while True:
            client = valkey_client.connect(
                self.cfg.sources_valkey(),
                connect_timeout_s=self.connect_timeout_s,
                timeout_s=self.load_timeout_s,
                health_check_interval=max(1, int(self.ping_interval_s)),
                socket_keepalive_options=_KEEPALIVE,
            )
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(REGISTRY_CHANNEL, DOMAIN_CHANNEL)
                if self._sub["connects"] and self._sub["last_error"] is not None:
                    event("source_subscription_restored", connects=self._sub["connects"] + 1)
                self._sub["connected"] = True
                self._sub["connects"] += 1
                backoff = self.backoff_initial_s
                self._request_all()  # events sent while we were not subscribed are lost: catch up once
                while True:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=self.ping_interval_s)
                    if msg is None or msg.get("type") != "message":
                        continue
                    hit = channels.get(msg["channel"])
                    if hit is not None:
                        self._sub["events"][hit[0]] += 1
                        hit[1].request(by_event=True)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._sub["connected"] or self._sub["last_error"] is None:
                    event("source_subscription_lost", "warning", error=_describe(exc), action="retrying")
                self._sub["connected"] = False
                self._sub["last_error"] = _describe(exc)
                self._sub["last_error_at"] = time.time()
                # The registry lives on the same Valkey: find out now rather than at the next poll.
                self.registry.request()
            finally:
                self._sub["connected"] = False
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
                await valkey_client.close(client)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.backoff_max_s)

    async def _poller(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.sources.poll_interval_s)
            self._request_all()

    async def _health_refresher(self) -> None:
        # Captain refreshes health_ts without publishing: re-read the registry well inside the freshness
        # window, or a healthy instance would look stale between safety polls.
        while True:
            await asyncio.sleep(self.cfg.sources.health_refresh_s)
            self.registry.request()

    async def _sighup(self, reload: asyncio.Event) -> None:
        while True:
            await reload.wait()
            reload.clear()
            self._request_all()

    # ---- protocol -------------------------------------------------------------------------------------

    def hand_over(self) -> None:
        """The resolver is stopping (a ``[sources]`` reload restarts it): until its successor reads the registry
        nobody does, so heartbeats must not age meanwhile. Republish with the health clock frozen at the last
        read; the successor starts from this table and unfreezes it with its first registry load."""
        self._handing_over = True
        self._rebuild()

    async def run(self, publish: Publish, reload: asyncio.Event) -> None:
        try:
            await self._boot()
            self._publish = publish
            self._rebuild()
            async with asyncio.TaskGroup() as tg:
                for src in self._sources:
                    if src.live:
                        tg.create_task(self._loader(src), name=f"sentin8-{src.name}-loader")
                if self._subscribe:
                    tg.create_task(self._subscriber(), name="sentin8-subscriber")
                if self.registry.live or self.domains.live:
                    tg.create_task(self._poller(), name="sentin8-poller")
                if self.registry.live:
                    tg.create_task(self._health_refresher(), name="sentin8-health-refresher")
                tg.create_task(self._sighup(reload), name="sentin8-sighup")
        finally:
            await self.close()

    async def close(self) -> None:
        client, self._valkey = self._valkey, None
        await valkey_client.close(client)
        if self._postgres is not None:
            await self._postgres.close()
