"""A rotating-address flood against two cluster fleets (issue 19 §1): clients from thousands of real source
addresses (a network namespace that owns a /19 of 198.19.0.0/16), spread over both hosts, each address used for
one connection and two requests. What must hold while the distinct keys keep growing, well past the size of the
bucket table: every answer 200 or 429, sync batches capped (<= 512 keys), the syncer's process (the resolver)
bounded in CPU per second and fixed in memory, and Valkey holding only the keys short of tokens.

R = 1, B = 1: after its first request an address's bucket is empty, below half its burst, so every key "matters"
and is synced (the syncer's worst case), and its second request is a 429.
"""

from __future__ import annotations

import secrets
import threading
import time
from pathlib import Path

import psutil
import pytest
import redis

from tests.netns import flood_host  # noqa: F401 - fixture
from tests.peers import Fleet, wait_until
from tests.pqclient import PQClient
from tests.test_cluster_fleet import health, metrics

pytestmark = pytest.mark.netns

SLOTS = 512  # shm.ratelimit_slots, the smallest table: the flood's distinct keys outgrow it several times
GET = b"GET /x HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n"
FLOOD_S = 30.0
ENOUGH = 6 * SLOTS  # distinct addresses after which the flood stops early
THREADS = 4


def _fleet(tmp_path: Path, name: str, web, valkey_url: str, secret: str, slots: int = SLOTS) -> Fleet:
    workdir = tmp_path / name
    workdir.mkdir(exist_ok=True)
    body = f"""
[policy]
rate_limit = true
rate_limit_rps = 1
rate_limit_burst = 1
[shm]
ratelimit_slots = {slots}
[cluster]
enabled = true
valkey_url = "{valkey_url}"
node_id = "{name}"
[[instances]]
service = "web"
id = "web-1"
host = "127.0.0.1"
port = {web.port}
[[domains]]
hostname = "shop.apps.test"
service = "web"
"""
    return Fleet(str(workdir), body, workers=1, host="0.0.0.0", mgmt=True, env={"SENTIN8_CLUSTER_SECRET": secret})


def _resolver(fleet: Fleet) -> psutil.Process:
    (pid,) = [pid for pid, title in fleet.children().items() if title.endswith(": resolver")]
    return psutil.Process(pid)


class Flood:
    """``THREADS`` threads, each taking the next address of the prefix, connecting from it to the next fleet, and
    sending two requests; every status recorded."""

    def __init__(self, host, fleets: list[Fleet]) -> None:
        self.host = host
        self.fleets = fleets
        self.next = 0
        self.statuses: dict[int, int] = {}
        self.twice = 0  # addresses whose two requests were both admitted (B = 1: one of them is over the limit)
        self.errors: list[BaseException] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def _take(self) -> int:
        with self.lock:
            i = self.next
            self.next += 1
            return i

    def _thread(self) -> None:
        context = PQClient.make_context()
        try:
            while not self.stop.is_set():
                i = self._take()
                fleet = self.fleets[i % len(self.fleets)]
                c = PQClient(
                    self.host.connect(fleet.port, source=self.host.address(i)), "shop.apps.test", context=context
                )
                c.handshake()
                got = [int(c.request(GET).split(b" ", 2)[1]) for _ in range(2)]
                c.close()
                with self.lock:
                    for status in got:
                        self.statuses[status] = self.statuses.get(status, 0) + 1
                    self.twice += got == [200, 200]
        except BaseException as exc:  # the test fails on it
            self.errors.append(exc)
            self.stop.set()

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._thread, daemon=True) for _ in range(THREADS)]
        for t in threads:
            t.start()
        return threads


def test_a_rotating_address_flood_keeps_batches_capped_and_the_syncer_bounded(
    tmp_path,
    web,
    redis_server,
    flood_host,  # noqa: F811
):
    secret = secrets.token_urlsafe(36)
    fleets = [_fleet(tmp_path, name, web, redis_server.url, secret) for name in ("a", "b")]
    try:
        for f in fleets:
            wait_until(lambda f=f: health(f)["cluster"]["hosts_seen"] == 2, 10, what="both hosts seen")
        resolvers = [_resolver(f) for f in fleets]
        flood = Flood(flood_host, fleets)
        begin = time.monotonic()
        cpu0 = [sum(r.cpu_times()[:2]) for r in resolvers]
        samples: list[tuple[float, int, list[int]]] = []  # (seconds, distinct addresses, each resolver's RSS)
        threads = flood.start()
        while time.monotonic() - begin < FLOOD_S and flood.next < ENOUGH and not flood.stop.is_set():
            samples.append((time.monotonic() - begin, flood.next, [r.memory_info().rss for r in resolvers]))
            flood.stop.wait(0.5)
        flood.stop.set()
        for t in threads:
            t.join(15)
        wall = time.monotonic() - begin
        cpu = [(sum(r.cpu_times()[:2]) - c0) / wall for r, c0 in zip(resolvers, cpu0, strict=True)]
        assert not flood.errors, flood.errors
        distinct = flood.next
        assert set(flood.statuses) == {200, 429}, flood.statuses  # only these, and both
        # the limit held for every key, also for those the syncer saw first after it went global: one admitted
        # request per address (a key whose first request was not sent would be refilled to the global level by
        # the write-back, and admit its second request too)
        assert flood.twice <= 0.01 * distinct, (flood.twice, distinct)
        assert distinct >= 1.5 * SLOTS, f"only {distinct} addresses in {wall:.0f} s: the table was not outgrown"

        # memory fixed: from the first quarter of the flood on, the resolvers' RSS stays put while the distinct
        # keys go on growing (the ledger and the table are arrays of the table's size; nothing per key)
        warm = next(s for s in samples if s[1] >= distinct // 4)
        growth = [max(s[2][i] for s in samples if s[0] >= warm[0]) - warm[2][i] for i in range(2)]
        grown_by = distinct - warm[1]
        per_s = distinct / wall
        m = [metrics(f) for f in fleets]
        client = redis.Redis.from_url(redis_server.url)
        held = client.dbsize()
        client.close()
        print(
            f"flood: {distinct} addresses in {wall:.1f} s ({per_s:.0f}/s), statuses {flood.statuses}, {flood.twice}"
            " admitted twice;"
            f" resolver CPU {[f'{c:.3f}' for c in cpu]} s/s; RSS growth {[g // 1024 for g in growth]} KiB while"
            f" {grown_by} more keys arrived (RSS {[s // 2**20 for s in samples[-1][2]]} MiB);"
            f" batch max {[x['sentin8_cluster_sync_batch_keys_max'] for x in m]},"
            f" keys synced {[x['sentin8_cluster_keys_synced_total'] for x in m]}, Valkey holds {held} keys"
        )
        assert grown_by >= distinct // 2
        assert all(g <= 2 * 2**20 for g in growth), growth
        assert all(c <= 0.25 for c in cpu), cpu  # a quarter of a core at most (measured: a few percent)
        for x in m:
            assert x["sentin8_cluster_limiter_global"] == 1 and x["sentin8_cluster_sync_errors_total"] == 0
            assert 0 < x["sentin8_cluster_sync_batch_keys_max"] <= 512
        # every key went to Valkey (each matters: R = B = 1), and each left it once full again (2 s)
        assert sum(x["sentin8_cluster_keys_synced_total"] for x in m) >= 0.9 * distinct
        assert held <= 4 * per_s + 16, held
    finally:
        for f in fleets:
            f.stop()


def test_a_stalled_syncers_backlog_leaves_in_batches_of_512(
    tmp_path,
    web,
    redis_server,
    flood_host,  # noqa: F811
):
    """The flood on host A while A's syncer is stopped (SIGSTOP of its resolver): the data path never waits on it
    (every answer 200 or 429, one admitted per address), the moved slots queue up in shared memory, and once it
    runs again they leave in round trips of at most 512 keys (the cap reached), the backlog drained."""
    secret = secrets.token_urlsafe(36)
    fleets = [_fleet(tmp_path, name, web, redis_server.url, secret, slots=2048) for name in ("a", "b")]
    a = fleets[0]
    try:
        for f in fleets:
            wait_until(lambda f=f: health(f)["cluster"]["hosts_seen"] == 2, 10, what="both hosts seen")
        resolver = _resolver(a)
        flood = Flood(flood_host, [a])
        threads = flood.start()
        resolver.suspend()
        try:
            wait_until(lambda: flood.next >= 700 or flood.stop.is_set(), 40, what="700 addresses, syncer stopped")
            cpu0 = sum(resolver.cpu_times()[:2])
        finally:
            resolver.resume()
        stalled = flood.next
        wait_until(
            lambda: (
                metrics(a)["sentin8_cluster_sync_batch_keys_max"] == 512
                and metrics(a)["sentin8_cluster_sync_backlog"] < 64
            ),
            10,
            what="the backlog sent in capped batches",
        )
        catch_up = sum(resolver.cpu_times()[:2]) - cpu0
        flood.stop.set()
        for t in threads:
            t.join(15)
        assert not flood.errors, flood.errors
        m = metrics(a)
        print(
            f"stalled syncer: {stalled} addresses queued up, batch max {m['sentin8_cluster_sync_batch_keys_max']},"
            f" keys synced {m['sentin8_cluster_keys_synced_total']}, catch-up CPU {catch_up:.3f} s,"
            f" statuses {flood.statuses}, {flood.twice} admitted twice"
        )
        assert set(flood.statuses) <= {200, 429} and flood.twice <= 0.01 * flood.next
        assert m["sentin8_cluster_sync_errors_total"] == 0 and m["sentin8_cluster_limiter_global"] == 1
        assert m["sentin8_cluster_keys_synced_total"] >= 0.9 * stalled
        assert catch_up < 1.0  # ~700 keys: a few round trips' worth of CPU
    finally:
        for f in fleets:
            f.stop()
