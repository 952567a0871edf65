"""The last-known routing table (issue 16 item 0): the cache file's format, splitting a table back into its
sources' parts, and the cache writer against a real file system (a full disk is the kernel's own ENOSPC,
from /dev/full)."""

from __future__ import annotations

import asyncio
import os
import struct
from pathlib import Path

import pytest

from sentin8 import routing, routing_cache
from sentin8.routing import Instance, Route, build
from sentin8.sources import lastknown
from supervisor import routing_cache as cache_io


def table(frozen_at: float = 0.0, beats: tuple[float, ...] = (100.0, 250.0)) -> routing.RoutingTable:
    instances = [Instance(f"web-{i}", "web", "10.0.0.1", 8000 + i, health_ts=ts) for i, ts in enumerate(beats)]
    instances.append(Instance("db-1", "db", "10.0.0.2", 5432, health_ts=200.0))
    routes = [Route("b.example.com", "web", "e", "a", "o"), Route("a.example.com", "db")]
    t = build(routes, instances, built_at=90.0)
    t.health_frozen_at = frozen_at
    return t


# ---- the file format -------------------------------------------------------------------------------------


def test_a_cache_file_round_trips_the_table_and_its_write_time() -> None:
    original = table()
    blob = routing_cache.encode(routing.encode(original), 1234.5)
    got, written_at = routing_cache.decode(blob)
    assert got == original and written_at == 1234.5


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda b: b[:10], "shorter than"),
        (lambda b: b[:-1], "torn"),
        (lambda b: b + b"x", "torn"),
        (lambda b: b"NOTOURS\n" + b[8:], "bad magic"),
        (lambda b: b[:8] + struct.pack(">H", routing_cache.FORMAT_VERSION + 1) + b[10:], "format version"),
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "checksum"),
        (lambda b: b"", "shorter than"),
    ],
    ids=["header-torn", "payload-short", "payload-long", "foreign", "other-version", "bit-flip", "empty"],
)
def test_a_damaged_or_foreign_cache_file_is_refused_with_its_reason(damage, reason: str) -> None:
    blob = routing_cache.encode(routing.encode(table()), 1.0)
    with pytest.raises(routing_cache.CacheInvalid, match=reason):
        routing_cache.decode(damage(blob))


def test_a_well_framed_payload_that_is_not_a_table_is_refused() -> None:
    with pytest.raises(routing_cache.CacheInvalid, match="does not decode"):
        routing_cache.decode(routing_cache.encode(b"\x93\x01\x02", 1.0))


# ---- splitting a table into its sources' parts ----------------------------------------------------------


def test_a_table_splits_back_into_its_registry_and_domains_parts() -> None:
    t = table()
    known = lastknown.from_table(t, lastknown.PUBLISHED, published_at=300.0)
    assert known.origin == "published" and known.built_at == 90.0
    assert [i.id for i in known.instances] == ["db-1", "web-0", "web-1"]
    assert [r.hostname for r in known.routes] == ["a.example.com", "b.example.com"]
    # rebuilt from its parts, the table is the same table: nothing is lost on the way through a restart
    assert build(known.routes, known.instances, built_at=t.built_at) == build(
        list(t.routes.values()), [i for v in t.services.values() for i in v], built_at=t.built_at
    )


def test_the_registry_part_is_judged_at_the_moment_it_was_read() -> None:
    # published while the registry was down: the frozen clock it carried
    assert lastknown.registry_read_at(table(frozen_at=180.0), 300.0) == 180.0
    # published live: the newest heartbeat, never later than the read that saw it
    assert lastknown.registry_read_at(table(), 300.0) == 250.0
    # no heartbeats at all (file instances, or no instance): the publication time
    assert lastknown.registry_read_at(table(beats=()), 300.0) == 200.0
    assert lastknown.registry_read_at(build([], [], 0.0), 300.0) == 300.0


# ---- the file on disk ------------------------------------------------------------------------------------


def _counts() -> tuple[list[str], cache_io.Count]:
    seen: list[str] = []
    return seen, seen.append


def test_the_writer_replaces_the_file_atomically_and_the_reader_gets_the_table(tmp_path: Path) -> None:
    seen, count = _counts()
    state = tmp_path / "state"  # created on the first write

    async def main() -> None:
        writer = cache_io.CacheWriter(str(state), count)
        for n in range(5):  # newest wins: however many are offered while one is written, the last one lands
            t = table(beats=(float(n),))
            writer.offer(routing.encode(t))
        assert writer._task is not None
        await writer._task
        assert writer.errors == 0 and 1 <= writer.writes <= 5

    asyncio.run(main())
    got = cache_io.read(str(state), count)
    assert got is not None and got[0] == table(beats=(4.0,))
    assert [p.name for p in state.iterdir()] == [routing_cache.FILE_NAME]  # no temp file left behind
    assert set(seen) == {"routing_cache_writes"}


def test_a_full_disk_is_counted_and_logged_once_and_the_next_table_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen, count = _counts()
    tmp = tmp_path / f".{routing_cache.FILE_NAME}.{os.getpid()}.tmp"

    async def main() -> None:
        writer = cache_io.CacheWriter(str(tmp_path), count)
        for _ in range(2):
            tmp.symlink_to("/dev/full")  # every write into it fails with the kernel's own ENOSPC
            writer.offer(routing.encode(table()))
            assert writer._task is not None
            await writer._task
            assert not tmp.exists()
        assert writer.errors == 2 and writer.writes == 0
        writer.offer(routing.encode(table()))
        await writer._task
        assert writer.writes == 1

    asyncio.run(main())
    out = capsys.readouterr().err
    assert out.count('"routing_cache_write_failed"') == 1 and "No space left on device" in out
    assert '"routing_cache_write_recovered"' in out
    assert seen == ["routing_cache_write_errors"] * 2 + ["routing_cache_writes"]
    assert cache_io.read(str(tmp_path), count) is not None


def test_a_corrupt_cache_file_is_ignored_with_a_counted_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen, count = _counts()
    assert cache_io.read(str(tmp_path), count) is None and seen == []  # absent: nothing to count
    path = Path(cache_io.cache_path(str(tmp_path)))
    path.write_bytes(routing_cache.encode(routing.encode(table()), 1.0)[:-7])
    assert cache_io.read(str(tmp_path), count) is None
    assert seen == ["routing_cache_invalid"]
    assert '"routing_cache_invalid"' in capsys.readouterr().err


def test_only_dead_writers_temp_files_are_removed(tmp_path: Path) -> None:
    dead = tmp_path / f".{routing_cache.FILE_NAME}.{2**22 + 12345}.tmp"  # above pid_max's default: no such pid
    alive = tmp_path / f".{routing_cache.FILE_NAME}.1.tmp"  # pid 1 is always alive
    other = tmp_path / "runtime-policy.json"
    for p in (dead, alive, other):
        p.write_bytes(b"x")
    cache_io.remove_leftovers(str(tmp_path))
    assert not dead.exists() and alive.exists() and other.exists()
