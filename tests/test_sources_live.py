"""LiveRunner against real servers: boot, events, debounce, outages and recovery, publish-on-change.

Every wait is an event (a publication) or a poll of ``status()`` with a deadline; no fixed sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from sentin8.config import Config, DomainEntry, InstanceEntry, Sources
from sentin8.routing import Instance, Route, RoutingTable
from sentin8.sources import lastknown
from sentin8.sources.domains import CHANGED_CHANNEL as DOMAIN_CHANNEL
from sentin8.sources.lastknown import LastKnown
from sentin8.sources.live import LiveRunner
from sentin8.sources.registry import CHANGED_CHANNEL as REGISTRY_CHANNEL
from tests.servers import (  # noqa: F401 (fixtures)
    PostgresServer,
    RedisServer,
    install_sys_schema,
    postgres_server,
    redis_server,
)

APPS = "apps.test"
ORG, ENV = str(uuid.UUID(int=1)), str(uuid.UUID(int=11))
FAST = {"backoff_initial_s": 0.05, "backoff_max_s": 0.4, "connect_timeout_s": 2, "load_timeout_s": 5}


class Recorder:
    """The ``publish`` callback: keeps every table and wakes waiters."""

    def __init__(self) -> None:
        self.tables: list[RoutingTable] = []
        self._changed = asyncio.Event()

    def __call__(self, table: RoutingTable) -> None:
        self.tables.append(table)
        self._changed.set()

    @property
    def last(self) -> RoutingTable:
        return self.tables[-1]

    async def wait_for(self, pred: Callable[[RoutingTable], bool], timeout: float = 10.0) -> RoutingTable:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            if self.tables and pred(self.tables[-1]):
                return self.tables[-1]
            self._changed.clear()  # no await since the check: a publication cannot slip between
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise AssertionError(f"no matching table within {timeout} s; last: {self.tables[-1:]}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)


async def until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll a condition on the runner's state with a deadline (the runner shares our loop)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        await asyncio.sleep(0.01)


def settled(runner: LiveRunner) -> bool:
    st = runner.status()
    return not st["registry"]["pending"] and not st["domains"]["pending"]


@contextlib.asynccontextmanager
async def running(runner: LiveRunner) -> AsyncIterator[tuple[Recorder, asyncio.Event]]:
    rec, reload = Recorder(), asyncio.Event()
    task = asyncio.create_task(runner.run(rec, reload))
    try:
        yield rec, reload
    finally:
        crashed = task.done()  # the runner must run until cancelled: an early end is a bug to surface
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert not crashed, "the runner ended on its own"


def instance(host: str = "10.0.0.1", port: int = 8443, state: str = "Active") -> str:
    return json.dumps({"host": host, "port": port, "state": state, "health_ts": time.time(), "tls": True})


def make_cfg(redis: RedisServer | None, proxy_dsn: str | None, **sources: Any) -> Config:
    opts: dict[str, Any] = {
        "registry": "valkey" if redis else "file",
        "domains": "postgres" if proxy_dsn else "file",
        "apps_domain": APPS,
        "poll_interval_s": 3600,  # events, not the safety poll, drive these tests unless a test says otherwise
        "boot_retries": 2,
        "boot_retry_interval_s": 0.05,
    }
    if redis:
        opts["valkey_url"] = redis.url
    if proxy_dsn:
        opts["postgres_dsn"] = proxy_dsn
    opts.update(sources)
    return Config(sources=Sources(**opts))


def add_app(admin_dsn: str, slug: str, service: str = "web", custom: list[str] | None = None, n: int = 0) -> str:
    app_id = str(uuid.UUID(int=1000 + n)) if n else str(uuid.uuid4())
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO sys.app_instances VALUES (%s, %s, %s, %s, %s, 'active')",
            (app_id, ENV, slug, service, custom or []),
        )
    return app_id


@pytest.fixture
def platform(postgres_server: PostgresServer) -> tuple[PostgresServer, str, str]:  # noqa: F811
    """(server, admin dsn, proxy-role dsn) with one active org/env and one app ``shop``."""
    proxy_dsn = install_sys_schema(postgres_server, "platform")
    admin_dsn = postgres_server.dsn(db="platform")
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO sys.orgs VALUES (%s, 'acme', 'active')", (ORG,))
        conn.execute("INSERT INTO sys.envs VALUES (%s, %s, 'prod', 'active')", (ENV, ORG))
    add_app(admin_dsn, "shop", n=1)
    return postgres_server, admin_dsn, proxy_dsn


SHOP = f"shop.prod.acme.{APPS}"


async def publish_event(redis: RedisServer, channel: str, payload: str = "x", times: int = 1) -> None:
    client = aioredis.Redis.from_url(redis.url)
    try:
        pipe = client.pipeline(transaction=False)
        for _ in range(times):
            pipe.publish(channel, payload)
        await pipe.execute()
    finally:
        await client.aclose()


async def hset(redis: RedisServer, service: str, **fields: str) -> None:
    client = aioredis.Redis.from_url(redis.url)
    try:
        await client.hset(f"captain:svc:{service}", mapping=fields)
    finally:
        await client.aclose()


# ---- boot ------------------------------------------------------------------------------------------------


def test_boot_publishes_both_sources_as_the_restricted_role(
    redis_server: RedisServer,  # noqa: F811
    platform: tuple[PostgresServer, str, str],
) -> None:
    _, _, proxy_dsn = platform
    assert proxy_dsn.startswith("postgresql://sentin8_proxy@")

    async def main() -> None:
        await hset(redis_server, "web", **{"web-1": instance(), "web-bad": "{"})
        runner = LiveRunner(make_cfg(redis_server, proxy_dsn), **FAST)
        async with running(runner) as (rec, _):
            table = await rec.wait_for(lambda t: True)
            assert not table.stale and table.built_at > 0
            assert table.resolve(SHOP) is not None and table.resolve(SHOP).service == "web"
            [inst] = table.instances("web")
            assert inst.id == "web-1" and inst.health_ts is not None  # carried through for pick-time freshness
            st = runner.status()
            assert st["registry"]["malformed"] == 1 and st["registry"]["ok"] and st["domains"]["ok"]

    asyncio.run(main())


def test_boot_with_sources_down_publishes_empty_stale_then_recovers(
    redis_server: RedisServer,  # noqa: F811
    platform: tuple[PostgresServer, str, str],
) -> None:
    server, _, proxy_dsn = platform
    server.stop()

    async def main() -> None:
        runner = LiveRunner(make_cfg(redis_server, proxy_dsn, boot_retries=3), **FAST)
        async with running(runner) as (rec, _):
            first = await rec.wait_for(lambda t: True)
            assert first.stale and first.routes == {} and first.built_at == 0.0
            assert runner.status()["domains"]["failures"] >= 4  # the first try and three retries
            await asyncio.to_thread(server.start)
            table = await rec.wait_for(lambda t: not t.stale)
            assert table.resolve(SHOP) is not None and table.built_at > 0

    asyncio.run(main())


def test_file_sources_only_publish_once_and_need_no_servers() -> None:
    cfg = Config(
        instances=[InstanceEntry(service="web", id="w1", host="127.0.0.1", port=9001)],
        domains=[DomainEntry(hostname="Shop.Example.com", service="web")],
    )

    async def main() -> None:
        runner = LiveRunner(cfg)
        async with running(runner) as (rec, reload):
            table = await rec.wait_for(lambda t: True)
            assert not table.stale and table.resolve("shop.example.com") is not None
            assert not runner.status()["subscriber"]["enabled"]
            reload.set()
            await until(lambda: not reload.is_set(), "SIGHUP handled")
            assert len(rec.tables) == 1

    asyncio.run(main())


# ---- events ----------------------------------------------------------------------------------------------


def test_inserted_app_and_new_instance_are_published_within_2s(
    redis_server: RedisServer,  # noqa: F811
    platform: tuple[PostgresServer, str, str],
) -> None:
    _, admin_dsn, proxy_dsn = platform

    async def main() -> None:
        runner = LiveRunner(make_cfg(redis_server, proxy_dsn), **FAST)  # the real 1 s registry debounce
        async with running(runner) as (rec, _):
            await rec.wait_for(lambda t: True)
            await until(lambda: runner.status()["subscriber"]["connected"] and settled(runner), "subscribed")

            add_app(admin_dsn, "blog", service="cms", custom=["Blog.Acme.com"])
            t0 = time.monotonic()
            await publish_event(redis_server, DOMAIN_CHANNEL, "app_instances")
            table = await rec.wait_for(lambda t: t.resolve("blog.acme.com") is not None, timeout=2.0)
            assert time.monotonic() - t0 < 2.0
            assert table.resolve(f"blog.prod.acme.{APPS}").service == "cms"

            await hset(redis_server, "cms", **{"cms-1": instance("10.0.0.9", 8080)})
            t0 = time.monotonic()
            await publish_event(redis_server, REGISTRY_CHANNEL, "cms")
            table = await rec.wait_for(lambda t: bool(t.instances("cms")), timeout=2.0)
            assert time.monotonic() - t0 < 2.0
            assert table.instances("cms")[0].port == 8080

    asyncio.run(main())


def test_a_burst_of_events_costs_a_few_reloads(
    redis_server: RedisServer,  # noqa: F811
    platform: tuple[PostgresServer, str, str],
) -> None:
    _, admin_dsn, proxy_dsn = platform

    async def main() -> None:
        runner = LiveRunner(make_cfg(redis_server, proxy_dsn), **FAST)
        async with running(runner) as (rec, _):
            await rec.wait_for(lambda t: True)
            await until(lambda: runner.status()["subscriber"]["connected"] and settled(runner), "subscribed")
            before = runner.status()

            add_app(admin_dsn, "burst")
            await hset(redis_server, "burst", **{"b-1": instance()})
            await publish_event(redis_server, DOMAIN_CHANNEL, times=100)
            await publish_event(redis_server, REGISTRY_CHANNEL, times=100)
            await rec.wait_for(
                lambda t: t.resolve(f"burst.prod.acme.{APPS}") is not None and bool(t.instances("burst"))
            )

            def all_handled() -> bool:
                ev = runner.status()["subscriber"]["events"]
                return ev[DOMAIN_CHANNEL] == 100 and ev[REGISTRY_CHANNEL] == 100 and settled(runner)

            await until(all_handled, "every event received and handled")
            after = runner.status()
            registry_reloads = after["registry"]["reloads"] - before["registry"]["reloads"]
            domain_reloads = after["domains"]["reloads"] - before["domains"]["reloads"]
            assert 1 <= registry_reloads <= 2, registry_reloads  # debounced: the burst fits in one window
            assert 1 <= domain_reloads <= 3, domain_reloads  # newest wins: one running, at most one pending

    asyncio.run(main())


def test_unchanged_data_is_not_republished_and_sighup_reloads(
    redis_server: RedisServer,  # noqa: F811
    platform: tuple[PostgresServer, str, str],
) -> None:
    _, _, proxy_dsn = platform

    async def main() -> None:
        runner = LiveRunner(make_cfg(redis_server, proxy_dsn), registry_debounce_s=0.05, **FAST)
        async with running(runner) as (rec, reload):
            await rec.wait_for(lambda t: True)
            await until(lambda: runner.status()["subscriber"]["connected"] and settled(runner), "subscribed")
            reloads = runner.status()["domains"]["reloads"]
            for _ in range(3):
                await publish_event(redis_server, DOMAIN_CHANNEL)
                await publish_event(redis_server, REGISTRY_CHANNEL)
            reload.set()
            await until(
                lambda: runner.status()["domains"]["reloads"] >= reloads + 2 and settled(runner), "reloads done"
            )
            assert len(rec.tables) == 1 and runner.status()["published"] == 1

    asyncio.run(main())


def test_safety_poll_picks_up_changes_without_events(
    redis_server: RedisServer,  # noqa: F811
    platform: tuple[PostgresServer, str, str],
) -> None:
    _, admin_dsn, proxy_dsn = platform

    async def main() -> None:
        cfg = make_cfg(redis_server, proxy_dsn, poll_interval_s=0.2)
        runner = LiveRunner(cfg, registry_debounce_s=0.05, **FAST)
        async with running(runner) as (rec, _):
            await rec.wait_for(lambda t: True)
            add_app(admin_dsn, "quiet")
            await hset(redis_server, "quiet", **{"q-1": instance()})
            await rec.wait_for(
                lambda t: t.resolve(f"quiet.prod.acme.{APPS}") is not None and bool(t.instances("quiet"))
            )

    asyncio.run(main())


def test_mixed_file_registry_and_postgres_domains(
    redis_server: RedisServer,  # noqa: F811
    platform: tuple[PostgresServer, str, str],
) -> None:
    _, admin_dsn, proxy_dsn = platform
    cfg = make_cfg(None, proxy_dsn, valkey_url=redis_server.url)  # Valkey is the domain-event bus only
    cfg.instances.append(InstanceEntry(service="web", id="w1", host="127.0.0.1", port=9001))

    async def main() -> None:
        runner = LiveRunner(cfg, **FAST)
        async with running(runner) as (rec, _):
            table = await rec.wait_for(lambda t: True)
            assert table.instances("web")[0].health_ts is None and table.resolve(SHOP) is not None
            await until(lambda: runner.status()["subscriber"]["connected"] and settled(runner), "subscribed")
            add_app(admin_dsn, "more")
            await publish_event(redis_server, DOMAIN_CHANNEL)
            await rec.wait_for(lambda t: t.resolve(f"more.prod.acme.{APPS}") is not None, timeout=2.0)

    asyncio.run(main())


# ---- outages ---------------------------------------------------------------------------------------------


def test_valkey_killed_keeps_the_table_as_stale_then_recovers(
    redis_server: RedisServer,  # noqa: F811
    platform: tuple[PostgresServer, str, str],
) -> None:
    _, _, proxy_dsn = platform

    async def main() -> None:
        await hset(redis_server, "web", **{"web-1": instance()})
        runner = LiveRunner(make_cfg(redis_server, proxy_dsn), registry_debounce_s=0.05, **FAST)
        async with running(runner) as (rec, _):
            good = await rec.wait_for(lambda t: True)
            await until(lambda: runner.status()["subscriber"]["connected"] and settled(runner), "subscribed")

            killed_at = time.time()
            await asyncio.to_thread(redis_server.stop, True)
            stale = await rec.wait_for(lambda t: t.stale)
            assert stale.routes == good.routes and stale.services == good.services  # last good data serves
            assert good.built_at <= stale.built_at <= killed_at  # the age of the last good load shows
            st = runner.status()
            assert not st["registry"]["ok"] and st["registry"]["last_error"] and st["domains"]["ok"]

            await asyncio.to_thread(redis_server.start)  # same port, empty: Valkey lost its data
            await until(lambda: runner.status()["subscriber"]["connects"] >= 2 and settled(runner), "resubscribed")
            recovered = await rec.wait_for(lambda t: not t.stale)
            assert recovered.built_at > killed_at

            await hset(redis_server, "web", **{"web-2": instance("10.0.0.2")})
            await publish_event(redis_server, REGISTRY_CHANNEL, "web")
            table = await rec.wait_for(lambda t: [i.id for i in t.instances("web")] == ["web-2"], timeout=2.0)
            assert not table.stale

    asyncio.run(main())


def test_postgres_stopped_keeps_the_table_as_stale_then_recovers(
    redis_server: RedisServer,  # noqa: F811
    platform: tuple[PostgresServer, str, str],
) -> None:
    server, admin_dsn, proxy_dsn = platform

    async def main() -> None:
        runner = LiveRunner(make_cfg(redis_server, proxy_dsn), **FAST)
        async with running(runner) as (rec, _):
            good = await rec.wait_for(lambda t: True)
            await until(lambda: runner.status()["subscriber"]["connected"] and settled(runner), "subscribed")

            stopped_at = time.time()
            await asyncio.to_thread(server.stop)
            await publish_event(redis_server, DOMAIN_CHANNEL)  # the next load finds Postgres gone
            stale = await rec.wait_for(lambda t: t.stale)
            assert stale.routes == good.routes and stale.built_at <= stopped_at
            assert not runner.status()["domains"]["ok"]

            await asyncio.to_thread(server.start)
            await rec.wait_for(lambda t: not t.stale)  # the backoff retries reconnect on their own
            await until(lambda: settled(runner), "settled")
            add_app(admin_dsn, "after")
            await publish_event(redis_server, DOMAIN_CHANNEL)
            table = await rec.wait_for(lambda t: t.resolve(f"after.prod.acme.{APPS}") is not None, timeout=2.0)
            assert not table.stale and table.resolve(SHOP) is not None

    asyncio.run(main())


def test_a_failed_publish_is_retried_not_fatal(
    redis_server: RedisServer,  # noqa: F811
    platform: tuple[PostgresServer, str, str],
) -> None:
    _, admin_dsn, proxy_dsn = platform

    async def main() -> None:
        runner = LiveRunner(make_cfg(redis_server, proxy_dsn), **FAST)
        rec = Recorder()
        fail = {"on": False}

        def publish(table: RoutingTable) -> None:
            if fail["on"]:
                raise RuntimeError("routing snapshot is too large")
            rec(table)

        task = asyncio.create_task(runner.run(publish, asyncio.Event()))
        try:
            await rec.wait_for(lambda t: True)
            await until(lambda: runner.status()["subscriber"]["connected"] and settled(runner), "subscribed")
            fail["on"] = True
            add_app(admin_dsn, "big")
            await publish_event(redis_server, DOMAIN_CHANNEL)
            await until(lambda: runner.status()["publish_error"] is not None, "publish failed")
            fail["on"] = False
            await publish_event(redis_server, DOMAIN_CHANNEL)
            await rec.wait_for(lambda t: t.resolve(f"big.prod.acme.{APPS}") is not None)
            assert runner.status()["publish_error"] is None and not task.done()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(main())


# ---- starting from the last-known table (issue 16 item 0) ------------------------------------------------


def _seed(**parts: Any) -> LastKnown:
    """A last-known table as a previous resolver would have left it: ``old`` routes, ``web-old`` instance."""
    beat = time.time() - 1.0
    defaults: dict[str, Any] = {
        "origin": lastknown.PUBLISHED,
        "instances": [Instance("web-old", "web", "10.9.9.9", 8443, health_ts=beat, tls=True)],
        "routes": [Route(f"old.prod.acme.{APPS}", "web")],
        "built_at": beat - 5.0,
        "registry_read_at": beat,
    }
    return LastKnown(**{**defaults, **parts})


def test_a_seeded_runner_with_valkey_down_keeps_the_registry_part_and_publishes_at_once(
    redis_server: RedisServer,  # noqa: F811
    platform: tuple[PostgresServer, str, str],
) -> None:
    """No boot wait with something to serve (boot_retries would wait 60 s), the registry's last-known part kept
    with its health clock frozen where it was read, the fresh domains beside it; fresh once Valkey is back."""
    _, _, proxy_dsn = platform
    redis_server.stop(kill=True)
    seed = _seed()

    async def main() -> None:
        cfg = make_cfg(redis_server, proxy_dsn, boot_retries=60, boot_retry_interval_s=1.0)
        runner = LiveRunner(cfg, seed=seed, **FAST)
        t0 = time.monotonic()
        async with running(runner) as (rec, _):
            first = await rec.wait_for(lambda t: True, timeout=5.0)
            assert time.monotonic() - t0 < 5.0
            assert first.stale and first.built_at == seed.built_at
            assert [i.id for i in first.instances("web")] == ["web-old"]  # the registry part survived
            assert first.resolve(SHOP) is not None and first.resolve(f"old.prod.acme.{APPS}") is None  # fresh domains
            assert first.health_frozen_at == seed.registry_read_at  # heartbeats do not age unread
            assert runner.status()["started_from"] == "published"

            await asyncio.to_thread(redis_server.start)
            await hset(redis_server, "web", **{"web-new": instance("10.0.0.7")})
            table = await rec.wait_for(lambda t: not t.stale, timeout=10.0)
            assert [i.id for i in table.instances("web")] == ["web-new"] and table.resolve(SHOP) is not None
            assert table.built_at > seed.built_at

    asyncio.run(main())


def test_a_seeded_runner_with_postgres_down_keeps_the_domains_part(
    redis_server: RedisServer,  # noqa: F811
    platform: tuple[PostgresServer, str, str],
) -> None:
    server, admin_dsn, proxy_dsn = platform
    server.stop()
    seed = _seed(routes=[Route(SHOP, "web", "env", "app", "org")])

    async def main() -> None:
        await hset(redis_server, "web", **{"web-1": instance()})
        cfg = make_cfg(redis_server, proxy_dsn, boot_retries=60, boot_retry_interval_s=1.0)
        runner = LiveRunner(cfg, seed=seed, **FAST)
        async with running(runner) as (rec, _):
            first = await rec.wait_for(lambda t: True, timeout=8.0)
            assert first.stale and first.resolve(SHOP) == Route(SHOP, "web", "env", "app", "org")
            assert [i.id for i in first.instances("web")] == ["web-1"]  # the registry part is fresh
            assert first.health_frozen_at == 0.0  # the registry is read: its clock runs
            assert not runner.status()["domains"]["ok"] and runner.status()["registry"]["ok"]

            await asyncio.to_thread(server.start)
            await until(lambda: runner.status()["subscriber"]["connected"], "subscribed")
            add_app(admin_dsn, "after")
            await publish_event(redis_server, DOMAIN_CHANNEL)
            table = await rec.wait_for(lambda t: t.resolve(f"after.prod.acme.{APPS}") is not None, timeout=10.0)
            assert not table.stale and table.resolve(SHOP) is not None

    asyncio.run(main())


def test_a_seeded_runner_with_both_sources_up_publishes_fresh_data_only(
    redis_server: RedisServer,  # noqa: F811
    platform: tuple[PostgresServer, str, str],
) -> None:
    """A restart with everything up never shows the last-known table: the first publication is fresh."""
    _, _, proxy_dsn = platform

    async def main() -> None:
        await hset(redis_server, "web", **{"web-1": instance()})
        runner = LiveRunner(make_cfg(redis_server, proxy_dsn), seed=_seed(origin=lastknown.DISK), **FAST)
        async with running(runner) as (rec, _):
            first = await rec.wait_for(lambda t: True)
            assert not first.stale and [i.id for i in first.instances("web")] == ["web-1"]
            assert first.resolve(f"old.prod.acme.{APPS}") is None and first.resolve(SHOP) is not None
            assert len(rec.tables) == 1

    asyncio.run(main())


def test_hand_over_freezes_the_health_clock_for_the_successor(
    redis_server: RedisServer,  # noqa: F811
    platform: tuple[PostgresServer, str, str],
) -> None:
    """A resolver stopped by a [sources] reload publishes its table with the health clock frozen at its last
    registry read: until the successor reads the registry nobody does, and heartbeats must not age meanwhile."""
    _, _, proxy_dsn = platform

    async def main() -> None:
        await hset(redis_server, "web", **{"web-1": instance()})
        runner = LiveRunner(make_cfg(redis_server, proxy_dsn), **FAST)
        async with running(runner) as (rec, _):
            first = await rec.wait_for(lambda t: True)
            assert first.health_frozen_at == 0.0
            runner.hand_over()
            last = rec.last
            assert last is not first and not last.stale and last.routes == first.routes
            assert last.health_frozen_at == runner.status()["registry"]["last_success"]
            seed = lastknown.from_table(last, lastknown.PUBLISHED, time.time())
            assert seed.registry_read_at == last.health_frozen_at  # what the successor starts its clock from

    asyncio.run(main())
