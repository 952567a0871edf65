"""The domain source on a PostgreSQL primary + hot standby (``pg_basebackup -R`` from the primary, streaming):
a multi-host DSN with ``target_session_attrs`` / ``load_balance_hosts`` loads from either, the primary stopped
leaves the domain map loading from the standby with every change made before the stop, and an event-driven load
that a lagging standby served is re-read (``sentin8.sources.live.STANDBY_RECHECK_S``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import psycopg
import pytest

from sentin8.config import load_bytes
from sentin8.sources.domains import CHANGED_CHANNEL as DOMAIN_CHANNEL
from sentin8.sources.domains import PostgresDomains
from sentin8.sources.live import LiveRunner
from tests.servers import PostgresServer, _workdir, install_sys_schema, redis_server  # noqa: F401 - fixture
from tests.test_sources_live import APPS, ENV, FAST, ORG, SHOP, add_app, make_cfg, publish_event, running, until

BLOG = f"blog.prod.acme.{APPS}"


@pytest.fixture
def pair() -> Iterator[tuple[PostgresServer, PostgresServer, str]]:
    """(primary, standby, the proxy role's DSN path ``sentin8_proxy@…/platform`` minus the hosts)."""
    with _workdir("s8-pgp-") as pd, _workdir("s8-pgs-") as sd:
        primary = PostgresServer(pd)
        primary.start()
        standby = None
        try:
            install_sys_schema(primary, "platform")
            with psycopg.connect(primary.dsn(db="platform"), autocommit=True) as conn:
                conn.execute("INSERT INTO sys.orgs VALUES (%s, 'acme', 'active')", (ORG,))
                conn.execute("INSERT INTO sys.envs VALUES (%s, %s, 'prod', 'active')", (ENV, ORG))
            add_app(primary.dsn(db="platform"), "shop", n=1)
            standby = PostgresServer(sd, standby_of=primary)
            standby.start()
            yield primary, standby, "platform"
        finally:
            for server in (standby, primary):
                if server is not None:
                    with contextlib.suppress(Exception):
                        server.stop(mode="immediate")


def dsn(*servers: PostgresServer, **params: str) -> str:
    hosts = ",".join(f"127.0.0.1:{s.port}" for s in servers)
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"postgresql://sentin8_proxy@{hosts}/platform" + (f"?{query}" if query else "")


def replayed(standby: PostgresServer, primary: PostgresServer) -> bool:
    with psycopg.connect(primary.dsn(), autocommit=True) as p:
        lsn = p.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    with psycopg.connect(standby.dsn(), autocommit=True) as s:
        return bool(s.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)).fetchone()[0])


async def wait_replayed(standby: PostgresServer, primary: PostgresServer) -> None:
    for _ in range(500):
        if replayed(standby, primary):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the standby did not replay the primary's WAL within 10 s")


def test_the_multi_host_dsn_passes_the_config_checks(pair) -> None:
    from sentin8.startup_checks import _postgres_dsn

    primary, standby, _ = pair
    text = dsn(primary, standby, target_session_attrs="prefer-standby", load_balance_hosts="random")
    cfg = load_bytes(f'[sources]\ndomains = "postgres"\npostgres_dsn = "{text}"\n'.encode())
    _postgres_dsn("sources.postgres_dsn", cfg.sources.postgres_dsn)


def test_prefer_standby_loads_from_the_standby_and_survives_the_primary(pair) -> None:
    primary, standby, _ = pair

    async def main() -> None:
        dom = PostgresDomains(
            dsn(primary, standby, target_session_attrs="prefer-standby", load_balance_hosts="random"), APPS
        )
        try:
            got = await dom.load()
            assert dom.standby and [r.hostname for r in got.routes] == [SHOP]
            add_app(primary.dsn(db="platform"), "blog", service="cms", n=2)
            await wait_replayed(standby, primary)
            primary.stop()  # the change was made before the stop: the standby serves it
            got = await dom.load()
            assert dom.standby and {r.hostname for r in got.routes} == {SHOP, BLOG}
        finally:
            await dom.close()

    asyncio.run(main())


def test_primary_first_fails_over_to_the_standby_on_the_next_load(pair) -> None:
    """``target_session_attrs=any`` (the default), the primary listed first: its death costs one failed load (the
    runner retries with backoff), and the reconnection lands on the standby."""
    primary, standby, _ = pair

    async def main() -> None:
        dom = PostgresDomains(dsn(primary, standby), APPS, connect_timeout_s=2)
        try:
            await dom.load()
            assert not dom.standby
            add_app(primary.dsn(db="platform"), "blog", service="cms", n=2)
            await wait_replayed(standby, primary)
            primary.stop()
            with contextlib.suppress(psycopg.Error):
                await dom.load()  # the session to the dead primary fails once
            got = await dom.load()
            assert dom.standby and {r.hostname for r in got.routes} == {SHOP, BLOG}
        finally:
            await dom.close()

    asyncio.run(main())


def test_an_event_served_by_a_lagging_standby_is_read_again(pair, redis_server) -> None:  # noqa: F811
    """Replay paused: the event's load misses the change; once replay resumes the re-read finds it, with no
    other event and the safety poll an hour away."""
    primary, standby, _ = pair

    async def main() -> None:
        cfg = make_cfg(None, dsn(standby, primary, target_session_attrs="prefer-standby"), registry="file")
        cfg.sources.valkey_url = redis_server.url
        runner = LiveRunner(cfg, **FAST)
        async with running(runner) as (rec, _):
            await rec.wait_for(lambda t: t.resolve(SHOP) is not None)
            await until(lambda: runner.status()["subscriber"]["connected"], "subscribed")
            assert runner.status()["domains"]["standby"] is True
            standby.execute("SELECT pg_wal_replay_pause()")
            add_app(primary.dsn(db="platform"), "blog", service="cms", n=2)
            loads = runner.status()["domains"]["reloads"]
            await publish_event(redis_server, DOMAIN_CHANNEL, "app_instances")
            await until(lambda: runner.status()["domains"]["reloads"] > loads, "the event's load")
            assert rec.last.resolve(BLOG) is None  # the standby has not replayed it
            standby.execute("SELECT pg_wal_replay_resume()")
            table = await rec.wait_for(lambda t: t.resolve(BLOG) is not None, timeout=8)
            assert table.resolve(BLOG).service == "cms"

    asyncio.run(main())
