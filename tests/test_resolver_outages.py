# ruff: noqa: F811 - pytest fixtures imported by name, then named as arguments
"""A resolver restarted during a source outage keeps the fleet's routing (issue 16 item 0).

The resolver is SIGKILLed, or restarted by a reload that changes ``[sources]``, while Valkey or PostgreSQL is
down, under continuous L4 (loopback) and L7 (PQ TLS from a network namespace) load: it starts from the table in
shared memory, so not one client request fails, and a change made once the source is back routes. A cold start
of the whole fleet with both sources down starts from the cache file in ``tls.state_dir``, marked stale; with a
corrupt cache file it starts as without one, and says so.

The boot retries are the platform's ``10 x 0.5 s``: a resolver that still started from nothing would publish an
empty table 5 s after its restart, well inside the outage each test holds.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from sentin8 import routing_cache
from tests.netns import external_host  # noqa: F401 - fixture
from tests.peers import HTTPBackend, wait_until
from tests.test_availability import _loaded_fleet, outage_platform  # noqa: F401 - fixture
from tests.test_fleet_live import hostname, routes_to

# Heartbeats go stale after HEALTH_FRESH_S: a registry read every 1 s + 1 s debounce leaves a published table's
# newest heartbeat up to ~2.5 s old, so a SIGKILLed resolver's successor has the rest to publish its frozen clock.
HEALTH_FRESH_S = 5.0
# After the restart the outage lasts past the old boot window (5 s) and past the heartbeat freshness window:
# the last-known instances must stay eligible on the frozen health clock.
AFTER_RESTART_S = HEALTH_FRESH_S + 1.5


def resolver_pid(fleet) -> int:
    [pid] = [pid for pid, title in fleet.children().items() if title.endswith(": resolver")]
    return pid


def _restart_marks(fleet) -> tuple[int, int]:
    known = [e for e in fleet.events("resolver_last_known") if e["origin"] == "published"]
    return len(known), len(fleet.events("source_boot_incomplete"))


def restarted_from_published(fleet, before: tuple[int, int]) -> bool:
    """A new resolver has started from the published table and published its own (stale) one."""
    return all(now > then for now, then in zip(_restart_marks(fleet), before, strict=True))


def sigkill_resolver(fleet) -> None:
    old = resolver_pid(fleet)
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: resolver_pid_or_none(fleet) not in (None, old), 10, 0.05, what="a new resolver")


def resolver_pid_or_none(fleet) -> int | None:
    pids = [pid for pid, title in fleet.children().items() if title.endswith(": resolver")]
    return pids[0] if len(pids) == 1 else None


def reload_with_changed_sources(fleet) -> None:
    """SIGHUP with one ``[sources]`` key changed: the supervisor restarts the resolver with the new sources."""
    text = Path(fleet.config).read_text()
    assert "poll_interval_s = 30\n" in text
    Path(fleet.config).write_text(text.replace("poll_interval_s = 30\n", "poll_interval_s = 29\n"))
    done = len(fleet.events("reload_done"))
    fleet.signal(signal.SIGHUP)
    wait_until(lambda: len(fleet.events("reload_done")) > done, 30, what="reload done")


def _restart_during_outage(platform, captain, backend_factory, fleet_factory, external_host, source, restart):
    fleet, load, web = _loaded_fleet(platform, captain, backend_factory, fleet_factory, external_host, HEALTH_FRESH_S)
    try:
        wait_until(lambda: load.total() > 20, 20, what="load flowing")
        if source == "valkey":
            platform.redis.stop(kill=True)
            # as in production, the running resolver notices first (its subscription drops): stale, clock frozen
            wait_until(lambda: fleet.saw("source_outage"), 10, 0.05, what="outage noticed")
        else:
            platform.pg.stop(mode="immediate")  # unnoticed until a domain event or poll: the new resolver finds it
        restarts = _restart_marks(fleet)
        restart(fleet)
        wait_until(lambda: restarted_from_published(fleet, restarts), 15, 0.05, what="resolver restarted")
        t_restart = time.monotonic()
        before = load.total()
        time.sleep(AFTER_RESTART_S)  # the outage goes on: the load runs on the new resolver's table
        during = load.total() - before
        assert load.errors == [], load.errors[:10]

        if source == "valkey":
            platform.redis.start()
            cart = backend_factory("cart", hostname("cart"))  # routed since the start; its instance is new
            captain.register("cart", "cart-1", cart.port, tls=True)
            wait_until(lambda: routes_to(fleet.port, hostname("cart"), b"cart"), 15, 0.05, what="cart routed")
        else:
            platform.pg.start()
            blog = backend_factory("blog", hostname("blog"))
            captain.register("blog", "blog-1", blog.port, tls=True)
            platform.add_app("blog", "blog")
            wait_until(lambda: routes_to(fleet.port, hostname("blog"), b"blog"), 15, 0.05, what="blog routed")
        stats = fleet.stats()
    finally:
        load.stop()
        web.close()
    print(
        f"{source} outage, resolver restarted ({restart.__name__}): {during} good exchanges in the "
        f"{AFTER_RESTART_S:.0f} s after it, {load.ok}; {time.monotonic() - t_restart:.1f} s to the change routed"
    )
    assert load.errors == [], load.errors[:10]
    assert during > AFTER_RESTART_S * 10  # traffic really flowed on the restarted resolver's table
    assert load.ok["l7_keepalive"] > 0 and load.ok["l4_keepalive"] > 0 and load.ok["l7_new"] > 0
    assert stats["resolver_started_from_published"] >= 1
    assert not fleet.events("routing_cache_invalid")


@pytest.mark.parametrize("source", ["valkey", "postgres"])
@pytest.mark.parametrize("restart", [sigkill_resolver, reload_with_changed_sources], ids=["sigkill", "reload"])
def test_a_resolver_restarted_during_an_outage_costs_no_request(
    outage_platform,
    backend_factory,
    fleet_factory,
    external_host,
    source,
    restart,
):
    platform, captain = outage_platform
    _restart_during_outage(platform, captain, backend_factory, fleet_factory, external_host, source, restart)


# ---- a cold start of the whole fleet ---------------------------------------------------------------------


def _health(fleet) -> dict:
    with urllib.request.urlopen(fleet.mgmt_url + "/health", timeout=5) as resp:
        return json.loads(resp.read())


def _l7_ok(fleet, external_host, sni: str) -> bool:
    from tests.pqclient import PQClient

    client = PQClient(external_host.connect(fleet.port), sni)
    try:
        client.handshake()
        return client.request(b"GET /cold HTTP/1.1\r\nHost: %s\r\n\r\n" % sni.encode()).startswith(b"HTTP/1.1 200 ")
    finally:
        client.close()


def _first_fleet_writes_its_cache(platform, captain, backend_factory, fleet_factory):
    """A fleet on live sources writes the cache; a full disk on the way (the kernel's ENOSPC, /dev/full) costs
    the cache one write and routing nothing."""
    shop = backend_factory("shop", hostname("shop"))
    captain.register("shop", "shop-1", shop.port, tls=True)
    platform.add_app("shop", "shop")
    platform.add_app("web", "web")
    extra = platform.sources(health_fresh_s=HEALTH_FRESH_S).replace("boot_retries = 10", "boot_retries = 2")
    fleet = fleet_factory("", extra=extra, host="0.0.0.0", mgmt=True)
    state = Path(fleet.workdir) / "state"
    wait_until(lambda: routes_to(fleet.port, hostname("shop"), b"shop"), 10, what="shop routed")
    wait_until(lambda: (state / routing_cache.FILE_NAME).exists(), 10, 0.05, what="cache written")
    full = state / f".{routing_cache.FILE_NAME}.{resolver_pid(fleet)}.tmp"

    def fill_the_disk() -> bool:
        try:
            full.symlink_to("/dev/full")  # the resolver's next temp file: every write fails with ENOSPC
        except FileExistsError:  # a heartbeat's write is in progress this very moment
            return False
        return True

    wait_until(fill_the_disk, 5, 0.01, what="the disk full")
    platform.add_app("full", "shop")  # a change: a publication, a cache write into the full "disk"
    wait_until(lambda: fleet.saw("routing_cache_write_failed"), 10, 0.05, what="the write failing")
    wait_until(lambda: routes_to(fleet.port, hostname("full"), b"shop"), 10, 0.05, what="routing unaffected")
    web = HTTPBackend("web")
    captain.register("web", "web-1", web.port, tls=False)  # the next publication is written again
    wait_until(lambda: fleet.saw("routing_cache_write_recovered"), 10, 0.05, what="the cache written again")

    def cached_services() -> set[str]:
        try:
            return set(routing_cache.decode((state / routing_cache.FILE_NAME).read_bytes())[0].services)
        except (OSError, routing_cache.CacheInvalid):
            return set()

    wait_until(lambda: cached_services() == {"shop", "web"}, 10, 0.05, what="web in the cache")
    stats = fleet.stats()
    assert stats["routing_cache_write_errors"] >= 1 and stats["routing_cache_writes"] >= 2
    assert not full.exists()
    wait_until(lambda: _health(fleet)["status"] == "ok", 10, 0.1, what="fresh")
    fleet.stop()
    return extra, web, state


def test_a_cold_start_with_both_sources_down_serves_the_cached_routes_as_stale(
    outage_platform,
    backend_factory,
    fleet_factory,
    external_host,
):
    platform, captain = outage_platform
    extra, web, state = _first_fleet_writes_its_cache(platform, captain, backend_factory, fleet_factory)
    try:
        platform.redis.stop(kill=True)
        platform.pg.stop(mode="immediate")
        cached = (state / routing_cache.FILE_NAME).read_bytes()
        fleet = fleet_factory("", extra=extra, host="0.0.0.0", mgmt=True)  # same state_dir: the same host
        # the resolver's start to its first publication: one attempt per source, not the boot retries' wait
        [started], [published] = fleet.events("resolver_start"), fleet.events("source_boot_incomplete")
        publish_s = published["ts"] - started["ts"]
        assert routes_to(fleet.port, hostname("shop"), b"shop") and routes_to(fleet.port, hostname("full"), b"shop")
        assert _l7_ok(fleet, external_host, hostname("web"))
        health = _health(fleet)
        assert health["status"] == "stale" and health["stale"] and health["mappings"] == 3
        stats = fleet.stats()
        assert stats["routing_cache_loaded"] == 1 and stats.get("routing_cache_invalid", 0) == 0
        [known] = fleet.events("resolver_last_known")
        assert known["origin"] == "disk" and known["routes"] == 3
        time.sleep(HEALTH_FRESH_S + 1.0)  # past the freshness window: the frozen clock keeps the instances
        assert routes_to(fleet.port, hostname("shop"), b"shop")
        assert _l7_ok(fleet, external_host, hostname("web"))
        assert (state / routing_cache.FILE_NAME).read_bytes() == cached  # a stale table is never written

        platform.redis.start()
        platform.pg.start()
        wait_until(lambda: _health(fleet)["status"] == "ok", 15, 0.1, what="fresh again")
        blog = backend_factory("blog", hostname("blog"))
        captain.register("blog", "blog-1", blog.port, tls=True)
        platform.add_app("blog", "blog")
        wait_until(lambda: routes_to(fleet.port, hostname("blog"), b"blog"), 15, 0.05, what="blog routed")
    finally:
        web.close()
    print(f"cold start from the cache with both sources down: published {publish_s:.2f} s after the resolver's start")
    assert publish_s < 2.0  # the boot retries would take 2 x 0.5 s more, the defaults 30 s


def test_a_cold_start_with_a_corrupt_cache_starts_as_without_one_and_says_so(
    outage_platform,
    backend_factory,
    fleet_factory,
):
    platform, captain = outage_platform
    extra, web, state = _first_fleet_writes_its_cache(platform, captain, backend_factory, fleet_factory)
    web.close()
    cache = state / routing_cache.FILE_NAME
    blob = bytearray(cache.read_bytes())
    blob[-1] ^= 0xFF  # one flipped bit: the checksum catches it
    cache.write_bytes(bytes(blob))
    platform.redis.stop(kill=True)
    platform.pg.stop(mode="immediate")
    fleet = fleet_factory("", extra=extra, host="0.0.0.0", mgmt=True)
    [invalid] = fleet.events("routing_cache_invalid")
    assert "checksum" in invalid["reason"]
    assert fleet.saw("source_boot_incomplete") and not fleet.events("resolver_last_known")
    assert fleet.stats()["routing_cache_invalid"] == 1
    health = _health(fleet)
    assert health["status"] == "stale" and health["mappings"] == 0  # what is known: nothing
    assert not routes_to(fleet.port, hostname("shop"), b"shop")
    assert cache.read_bytes() == bytes(blob)  # nothing fresh to replace it with yet
