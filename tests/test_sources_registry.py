"""The Valkey registry: parsing (sans-IO, exhaustive on malformed input) and fetching from a real server."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis.asyncio as aioredis

from sentin8.routing import Instance
from sentin8.sources.registry import MalformedEntry, fetch_registry, parse_entry, parse_registry
from tests.servers import RedisServer, redis_server  # noqa: F401 (fixture)

GOOD = {"host": "10.1.2.3", "port": 8443, "state": "Active", "health_ts": 1764460000.25, "tls": True}


def entry(**over: object) -> str:
    doc = {**GOOD, **over}
    return json.dumps({k: v for k, v in doc.items() if v is not ...})


def test_parse_entry_carries_every_field() -> None:
    inst = parse_entry("web", "web-1", entry())
    assert inst == Instance("web-1", "web", "10.1.2.3", 8443, "Active", 1764460000.25, True)


def test_parse_entry_accepts_bytes_int_timestamp_and_missing_tls() -> None:
    inst = parse_entry("web", "web-1", entry(health_ts=1764460000, tls=...).encode())
    assert inst.health_ts == 1764460000.0 and isinstance(inst.health_ts, float)
    assert inst.tls is False


def test_proxy_protocol_is_optional_and_old_records_mean_none() -> None:
    assert parse_entry("web", "w", entry()).proxy_protocol == ""  # a record from before the field
    assert parse_entry("web", "w", entry(proxy_protocol=None)).proxy_protocol == ""
    assert parse_entry("web", "w", entry(proxy_protocol="")).proxy_protocol == ""
    assert parse_entry("web", "w", entry(proxy_protocol="v2")).proxy_protocol == "v2"


def test_parse_entry_keeps_non_active_states_for_selection_to_judge() -> None:
    assert parse_entry("web", "w", entry(state="Draining")).state == "Draining"


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        "[1, 2]",
        '"a string"',
        entry(host=...),
        entry(host=""),
        entry(host=42),
        entry(host="10.0.0.1 evil"),
        entry(port=...),
        entry(port=0),
        entry(port=65536),
        entry(port="8443"),
        entry(port=True),
        entry(port=8443.5),
        entry(state=...),
        entry(state=1),
        entry(health_ts=...),
        entry(health_ts=None),
        entry(health_ts="1764460000"),
        entry(health_ts=True),
        '{"host": "10.0.0.1", "port": 1, "state": "Active", "health_ts": NaN}',
        '{"host": "10.0.0.1", "port": 1, "state": "Active", "health_ts": Infinity}',
        entry(tls="yes"),
        entry(tls=1),
        entry(proxy_protocol="v1"),
        entry(proxy_protocol="V2"),
        entry(proxy_protocol=2),
        entry(proxy_protocol=True),
        entry(proxy_protocol=["v2"]),
        b"\xff\xfe not utf-8",
    ],
)
def test_parse_entry_rejects_malformed(raw: str | bytes) -> None:
    with pytest.raises(MalformedEntry):
        parse_entry("web", "web-1", raw)


def test_parse_registry_skips_and_counts_malformed_entries_and_keys() -> None:
    got = parse_registry(
        {
            b"captain:svc:web": {b"web-2": entry(host="10.0.0.2"), b"web-1": entry(), b"web-bad": b"{"},
            "captain:svc:api": {"api-1": entry(port=9000, tls=False), "": entry()},
            "captain:svc:": {"x": entry()},
            "other:key": {"x": entry()},
            b"captain:svc:\xff": {"x": entry()},
            b"captain:svc:db": {b"\xff": entry()},
        }
    )
    assert [(i.service, i.id) for i in got.instances] == [("api", "api-1"), ("web", "web-1"), ("web", "web-2")]
    assert got.malformed == 6
    assert any("web-bad" in e for e in got.errors)


def test_parse_registry_bounds_the_errors_it_keeps() -> None:
    got = parse_registry({"captain:svc:web": {f"w{i}": "{" for i in range(1000)}})
    assert got.malformed == 1000 and got.instances == []
    assert 0 < len(got.errors) <= 20


def test_parse_registry_empty() -> None:
    got = parse_registry({})
    assert got.instances == [] and got.malformed == 0


def test_fetch_registry_from_a_real_server(redis_server: RedisServer) -> None:  # noqa: F811
    with redis_server.client() as c:
        c.hset("captain:svc:web", mapping={"web-1": entry(), "web-2": entry(host="10.0.0.2", state="Draining")})
        c.hset("captain:svc:api", mapping={"api-1": entry(port=9000, tls=False), "api-bad": "nope"})
        c.set("captain:svc:broken", "a string, not a hash")  # WRONGTYPE for HGETALL: counted, not fatal
        c.hset("captain:other", mapping={"x": entry()})  # outside the pattern
        c.set("unrelated", "1")

    async def main() -> None:
        client = aioredis.Redis.from_url(redis_server.url)
        try:
            got = await fetch_registry(client)
        finally:
            await client.aclose()
        assert [(i.service, i.id, i.state) for i in got.instances] == [
            ("api", "api-1", "Active"),
            ("web", "web-1", "Active"),
            ("web", "web-2", "Draining"),
        ]
        assert got.instances[1].health_ts == GOOD["health_ts"]
        assert got.malformed == 2
        assert any("captain:svc:broken" in e and "not a hash" in e for e in got.errors)

    asyncio.run(main())


def test_fetch_registry_many_services_spans_scan_pages_and_pipeline_batches(redis_server: RedisServer) -> None:  # noqa: F811
    with redis_server.client() as c, c.pipeline(transaction=False) as pipe:
        for n in range(1234):
            pipe.hset(f"captain:svc:s{n}", mapping={f"s{n}-a": entry(port=1000 + n % 60000), f"s{n}-b": entry()})
        pipe.execute()

    async def main() -> None:
        client = aioredis.Redis.from_url(redis_server.url)
        try:
            got = await fetch_registry(client, scan_count=100, batch=100)
        finally:
            await client.aclose()
        assert len(got.instances) == 2468 and got.malformed == 0
        assert len({i.service for i in got.instances}) == 1234

    asyncio.run(main())


def test_fetch_registry_fails_loudly_when_the_server_is_gone(redis_server: RedisServer) -> None:  # noqa: F811
    url = redis_server.url
    redis_server.stop(kill=True)

    async def main() -> None:
        client = aioredis.Redis.from_url(url, socket_connect_timeout=2)
        try:
            with pytest.raises((aioredis.ConnectionError, OSError)):
                await fetch_registry(client)
        finally:
            await client.aclose()

    asyncio.run(main())
