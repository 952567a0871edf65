"""Propagation latency: a change event -> the first connection routed to the new backend.

    .venv/bin/python -m bench.propagation [--rounds 10]

Private redis-server/valkey-server and PostgreSQL, the real fleet on live sources. Each round registers a new
instance for an existing app (``captain:changed``, debounced 1 s by design) or adds a new app
(``sentin8:sys:domain:changed``, newest wins, no debounce), then polls the proxy every 5 ms until a TLS
connection through it reaches the new backend. Prints the median and max per event kind.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from tests.peers import Fleet, TLSBackend, wait_until
from tests.servers import running_postgres, running_redis
from tests.test_fleet_live import Platform, hostname, routes_to


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="sentin8-prop-")
    results: dict[str, list[float]] = {"registry (captain:changed)": [], "domain (sys:domain:changed)": []}
    with running_redis() as redis, running_postgres() as pg:
        platform = Platform(redis, pg)
        fleet = Fleet(workdir, "", extra=platform.sources())
        try:
            base = TLSBackend("base", hostname("base"), workdir)
            platform.set_instance("base", "base-0", base.port)
            platform.add_app("base", "base")
            wait_until(lambda: routes_to(fleet.port, hostname("base"), b"base"), 10, what="warm-up")
            for i in range(args.rounds):
                # a new instance replaces the old one for an existing app: registry event
                backend = TLSBackend(f"r{i}", hostname("base"), workdir)
                t0 = time.monotonic()
                redis.client().delete("captain:svc:base")
                platform.set_instance("base", f"base-{i + 1}", backend.port)
                wait_until(lambda b=backend: routes_to(fleet.port, hostname("base"), b.name.encode()), 10, 0.005)
                results["registry (captain:changed)"].append(time.monotonic() - t0)
                # a brand-new app with its own instance: the domain event is the last one to land
                app = f"app{i}"
                fresh = TLSBackend(app, hostname(app), workdir)
                platform.set_instance(app, f"{app}-1", fresh.port)
                time.sleep(1.2)  # let the registry event land first, so this round times the domain path alone
                t0 = time.monotonic()
                platform.add_app(app, app)
                wait_until(lambda a=app: routes_to(fleet.port, hostname(a), a.encode()), 10, 0.005)
                results["domain (sys:domain:changed)"].append(time.monotonic() - t0)
        finally:
            fleet.stop()
    print(f"event -> first routed connection, {args.rounds} rounds (registry debounce 1 s by design)")
    for kind, values in results.items():
        ms = [v * 1000 for v in values]
        print(f"  {kind:30} median {statistics.median(ms):7.0f} ms   max {max(ms):7.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
