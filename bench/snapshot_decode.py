"""What one routing change costs: build + encode in the resolver, decode in every worker (ARCHITECTURE.md §4).

A table of 10,000 hostnames and 10,000 instances (defaults) is rebuilt for each change (one instance's
health_ts moves, as after a registry reload), encoded, and decoded with ``routing.decode`` while the
previously decoded table is still alive (a worker swaps tables, it does not start empty). Decode is measured
with the GC running and with it paused (``gc.disable()`` around the decode), medians of N changes.

    .venv/bin/python bench/snapshot_decode.py [--hostnames 10000] [--instances 10000] [--changes 31]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sentin8.config import Config
from sentin8.routing import Instance, Route, RoutingTable, build, decode, encode


def make_rows(hostnames: int, instances: int, per_service: int) -> tuple[list[Route], list[Instance]]:
    services = max(1, instances // per_service)
    now = time.time()
    insts = [
        Instance(
            id=f"svc-{n % services:05d}-{n:06d}",
            service=f"svc-{n % services:05d}",
            host=f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}",
            port=8000 + n % 1000,
            state="Active",
            health_ts=now - n % 25,
            tls=bool(n & 1),
        )
        for n in range(instances)
    ]
    routes = [
        Route(
            hostname=f"app{n:05d}.env{n % 7}.org{n % 997:03d}.apps.example.com",
            service=f"svc-{n % services:05d}",
            env_id=f"00000000-0000-0000-0000-{n % 9973:012d}",
            app_id=f"00000000-0000-0000-0001-{n:012d}",
            org_id=f"00000000-0000-0000-0002-{n % 997:012d}",
        )
        for n in range(hostnames)
    ]
    return routes, insts


def ms(samples: list[float]) -> str:
    return f"median {statistics.median(samples) * 1e3:7.2f} ms   max {max(samples) * 1e3:7.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hostnames", type=int, default=10_000)
    ap.add_argument("--instances", type=int, default=10_000)
    ap.add_argument("--per-service", type=int, default=4, help="instances per service")
    ap.add_argument("--changes", type=int, default=31, help="changes measured (N of the medians)")
    args = ap.parse_args()

    routes, insts = make_rows(args.hostnames, args.instances, args.per_service)
    capacity = Config().shm.snapshot_bytes
    build_s: list[float] = []
    encode_s: list[float] = []
    decode_gc_s: list[float] = []
    decode_nogc_s: list[float] = []
    size = 0
    live: RoutingTable = decode(encode(build(routes, insts, time.time())))  # the table a worker holds

    for change in range(args.changes):
        # One instance's heartbeat moved: the whole table is rebuilt and re-encoded (snapshots are not deltas).
        victim = insts[change % len(insts)]
        insts[change % len(insts)] = Instance(
            victim.id, victim.service, victim.host, victim.port, victim.state, time.time(), victim.tls
        )
        t0 = time.perf_counter()
        table = build(routes, insts, time.time())
        t1 = time.perf_counter()
        data = encode(table)
        t2 = time.perf_counter()
        build_s.append(t1 - t0)
        encode_s.append(t2 - t1)
        size = len(data)

        t0 = time.perf_counter()
        new = decode(data)
        decode_gc_s.append(time.perf_counter() - t0)
        live = new  # the swap: the old table becomes garbage now

        gc.disable()
        try:
            t0 = time.perf_counter()
            new = decode(data)
            decode_nogc_s.append(time.perf_counter() - t0)
        finally:
            gc.enable()
        live = new

    assert live.resolve(routes[0].hostname) == routes[0]
    print(f"routing snapshot: {args.hostnames} hostnames, {args.instances} instances, N = {args.changes} changes")
    print(f"python {sys.version.split()[0]}, cpu {os.cpu_count()}")
    print(f"encoded size      {size:>10,} bytes ({size / 2**20:.2f} MiB)")
    fits = "yes" if size <= capacity else "NO: raise shm.snapshot_bytes"
    print(f"fits default shm.snapshot_bytes ({capacity:,} bytes per buffer): {fits} ({size / capacity:.1%} used)")
    print(f"build (resolver)        {ms(build_s)}")
    print(f"encode (resolver)       {ms(encode_s)}")
    print(f"decode, GC running      {ms(decode_gc_s)}")
    print(f"decode, GC paused       {ms(decode_nogc_s)}")


if __name__ == "__main__":
    main()
