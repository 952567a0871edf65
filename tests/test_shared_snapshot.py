"""The seqlock double buffer under a real multi-process race: a torn snapshot must never be accepted."""

from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import random
import time
import zlib

import pytest

from sentin8.shm.snapshot import SnapshotReader, SnapshotTooLarge, SnapshotWriter, region_bytes

CAP = 256 * 1024


def payload(gen: int) -> bytes:
    """Self-checking content: size and bytes both derive from the generation."""
    rnd = random.Random(gen)
    body = bytes([gen & 0xFF]) * rnd.randrange(1, CAP - 16)
    return gen.to_bytes(8, "little") + body + zlib.crc32(body).to_bytes(8, "little")


def check(data: bytes) -> bool:
    gen = int.from_bytes(data[:8], "little")
    return data == payload(gen)


def _writer(mm, stop, published):
    w = SnapshotWriter(memoryview(mm)[: region_bytes(CAP)], CAP)
    gen = 0
    while not stop.is_set():
        gen += 1
        w.publish(payload(gen))
    published.value = gen


def _reader(mm, stop, result):
    r = SnapshotReader(memoryview(mm)[: region_bytes(CAP)], CAP)
    good = bad = 0
    last = 0
    while not stop.is_set():
        got = r.read()
        if got is None:
            continue
        gen, data, _ = got
        if check(data) and gen >= last:
            good += 1
            last = gen
        else:
            bad += 1
    result.put((good, bad, r.torn_reads))


def test_no_torn_snapshot_under_a_multi_process_race():
    ctx = mp.get_context("fork")
    mm = mmap.mmap(-1, region_bytes(CAP), flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    stop = ctx.Event()
    results = ctx.Queue()
    published = ctx.Value("q", 0)
    writer = ctx.Process(target=_writer, args=(mm, stop, published))
    readers = [ctx.Process(target=_reader, args=(mm, stop, results)) for _ in range(2)]
    writer.start()
    for p in readers:
        p.start()
    time.sleep(2.0)  # the test's duration, not a synchronisation
    stop.set()
    totals = [results.get(timeout=10) for _ in readers]
    writer.join(10)
    for p in readers:
        p.join(10)
    good = sum(t[0] for t in totals)
    bad = sum(t[1] for t in totals)
    torn = sum(t[2] for t in totals)
    assert published.value > 100, "the writer must actually race the readers"
    assert good > 100
    assert bad == 0, f"{bad} torn snapshots accepted"
    print(f"published={published.value} accepted={good} rejected-and-retried={torn} pid={os.getpid()}")


def test_overflow_is_an_error_and_keeps_the_live_snapshot():
    mm = mmap.mmap(-1, region_bytes(1024))
    w = SnapshotWriter(memoryview(mm), 1024)
    r = SnapshotReader(memoryview(mm), 1024)
    assert r.read() is None
    w.publish(b"small")
    with pytest.raises(SnapshotTooLarge, match=r"shm\.snapshot_bytes"):
        w.publish(b"x" * 2048)
    assert r.read()[1] == b"small"
