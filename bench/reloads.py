"""Reloads under load: N SIGHUPs while L4 and L7 clients (new connections and keep-alive) run without pause.

    sudo .venv/bin/python -m bench.reloads [--reloads 100] [--workers 2] [--gap 0.1]

The real fleet on file sources, a TLS backend (L4, internal clients on loopback) and an HTTP backend (L7,
external PQ-TLS clients in a network namespace: needs root). Each round sends SIGHUP and waits for the
``reload_done`` event. Prints client errors (the figure that must be 0), reload durations, and the exchange
rate before and during the reloads.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import tempfile
import time

from tests.load import Load
from tests.netns import ExternalHost
from tests.peers import Fleet, HTTPBackend, TLSBackend, wait_until
from tests.test_reload import mixed_body


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reloads", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--gap", type=float, default=0.1, help="seconds between a reload's end and the next SIGHUP")
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="sentin8-reloads-")
    web = HTTPBackend("web")
    shop = TLSBackend("shop", "shop.internal", workdir)
    host = ExternalHost()
    fleet = Fleet(workdir, mixed_body(web.port, shop.port), args.workers, host="0.0.0.0",
                  fleet="drain_timeout_s = 3\ndrain_idle_grace_s = 0.5")
    load = Load()
    took: list[float] = []
    try:
        load.l4(fleet.port, "shop.internal", b"shop:", new_conns=1, keepalive=1)
        load.l7(lambda: host.connect(fleet.port), "web.apps.test", new_conns=1, keepalive=2)
        wait_until(lambda: load.total() > 20, 20, what="load flowing")
        n0, t0 = load.total(), time.monotonic()
        time.sleep(5)
        calm_rate = (load.total() - n0) / (time.monotonic() - t0)
        n1, t1 = load.total(), time.monotonic()
        for i in range(args.reloads):
            done = len(fleet.events("reload_done"))
            start = time.monotonic()
            fleet.signal(signal.SIGHUP)
            wait_until(lambda d=done: len(fleet.events("reload_done")) > d, 60, 0.01, what=f"reload {i + 1}")
            took.append(time.monotonic() - start)
            time.sleep(args.gap)
        busy_rate = (load.total() - n1) / (time.monotonic() - t1)
    finally:
        load.stop()
        fleet.stop()
        host.close()
        web.close()
        shop.close()
    ms = sorted(v * 1000 for v in took)
    print(f"{args.reloads} SIGHUP reloads, {args.workers} workers, L4 + L7 load (new connections and keep-alive)")
    print(f"  client errors      {len(load.errors)}")
    print(f"  reload duration    median {statistics.median(ms):.0f} ms, p99 {ms[int(0.99 * (len(ms) - 1))]:.0f} ms,"
          f" max {ms[-1]:.0f} ms")
    print(f"  exchanges/s        {calm_rate:.0f} without reloads, {busy_rate:.0f} during them")
    print(f"  exchanges          {dict(load.ok)}")
    for line in load.errors[:10]:
        print(f"  error: {line}")
    return 1 if load.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
