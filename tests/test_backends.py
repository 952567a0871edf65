"""sentin8.backends over the real shared-memory pieces (suspect table, counters) in a private mapping, and a
real TCP connect through workers.connect.connect_first."""

from __future__ import annotations

import socket

import uvloop

from sentin8 import routing
from sentin8.backends import Backends
from sentin8.routing import Instance, Route, RoutingTable
from sentin8.selection import Selector
from sentin8.shm.counters import CounterReader, WorkerCounters, region_bytes
from sentin8.shm.suspects import SuspectTable
from workers.connect import connect_first
from workers.poll_set import PollSet


class Snapshot:
    """Stands in for the SnapshotCache: the table the resolver published last (None before the first)."""

    def __init__(self, table: RoutingTable | None) -> None:
        self.table = table

    def current(self) -> RoutingTable | None:
        return self.table


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(instances: list[Instance], table: bool = True) -> tuple[Backends, Snapshot, CounterReader, Clock]:
    counter_view = memoryview(bytearray(region_bytes(1, 0)))
    suspects = SuspectTable(memoryview(bytearray(SuspectTable.region_bytes(64))), 64)
    snap = Snapshot(routing.build([Route("shop.test", "web")], instances, built_at=0.0) if table else None)
    clock = Clock()
    backends = Backends(snap, Selector(suspects, 30, 10), WorkerCounters(counter_view, 0), clock)
    return backends, snap, CounterReader(counter_view, 1), clock


def web(i: int, port: int = 1) -> Instance:
    return Instance(f"web-{i}", "web", "127.0.0.1", port)


def test_resolve_and_round_robin_candidates():
    backends, _, _, _ = make([web(0), web(1), web(2)])
    assert backends.resolve("SHOP.test").service == "web"
    assert backends.resolve("other.test") is None
    firsts = [backends.candidates("web")[0].id for _ in range(4)]
    assert firsts == ["web-0", "web-1", "web-2", "web-0"]
    assert backends.candidates("ghost") == []


def test_no_snapshot_yet_resolves_nothing():
    backends, _, _, _ = make([web(0)], table=False)
    assert backends.resolve("shop.test") is None and backends.candidates("web") == []


def test_a_failure_is_counted_once_and_sends_the_instance_last_until_its_ttl():
    backends, _, counters, clock = make([web(0), web(1)])
    backends.failed(web(0))
    assert counters.total()["backend_connect_errors"] == 1
    for _ in range(4):  # whatever the rotation, the suspect goes last
        assert [i.id for i in backends.candidates("web")] == ["web-1", "web-0"]
    clock.now += 11  # suspect_ttl_s = 10
    assert {backends.candidates("web")[0].id for _ in range(2)} == {"web-0", "web-1"}
    assert counters.total()["all_suspect_fallback"] == 0


def test_all_suspect_still_tried_and_counted():
    backends, _, counters, _ = make([web(0), web(1)])
    backends.failed(web(0))
    backends.failed(web(1))
    assert len(backends.candidates("web")) == 2
    total = counters.total()
    assert total["all_suspect_fallback"] == 1 and total["backend_connect_errors"] == 2


def test_connect_first_skips_and_reports_the_unreachable():
    live = socket.create_server(("127.0.0.1", 0))
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: refused
    try:
        order = [web(0, dead.getsockname()[1]), web(1, live.getsockname()[1])]
        backends, _, counters, _ = make(order)
        loop = uvloop.new_event_loop()
        poll = PollSet(loop)  # the worker's L4 sockets' epoll set: the connect waits in it
        try:
            picked = loop.run_until_complete(connect_first(poll, backends, order, 2.0))
            assert picked is not None
            inst, sock = picked
            assert inst is order[1] and sock.getpeername()[1] == live.getsockname()[1]
            sock.close()
            assert loop.run_until_complete(connect_first(poll, backends, order[:1], 2.0)) is None
        finally:
            loop.close()
        assert counters.total()["backend_connect_errors"] == 2
        assert [i.id for i in backends.candidates("web")] == ["web-1", "web-0"]
    finally:
        live.close()
        dead.close()


def test_breaker_opens_on_failures_skips_the_instance_and_fails_fast_when_all_are_open():
    from sentin8.breaker import BreakerRules
    from sentin8.shm.breakers import BreakerTable
    from sentin8.shm.breakers import region_bytes as breaker_bytes

    counter_view = memoryview(bytearray(region_bytes(1, 0)))
    counters = CounterReader(counter_view, 1)
    clock = Clock()
    rules = BreakerRules(failures=2, failure_ratio=1.0, min_requests=100, window_s=10, open_s=5, probe_timeout_s=5)
    table = BreakerTable(memoryview(bytearray(breaker_bytes(64))), 64, rules, clock)
    suspects = SuspectTable(memoryview(bytearray(SuspectTable.region_bytes(64))), 64)
    snap = Snapshot(routing.build([Route("shop.test", "web")], [web(0), web(1)], built_at=0.0))
    backends = Backends(snap, Selector(suspects, 30, 10), WorkerCounters(counter_view, 0), clock, table, 5.0)
    backends.failed(web(0))
    backends.failed(web(0))  # two consecutive failures: web-0's breaker opens, for every worker
    assert {i.id for i in backends.candidates("web")} == {"web-1"}
    total = counters.total()
    assert total["breaker_opened"] == 1 and total["breaker_skipped"] == 1 and total["backend_connect_errors"] == 2
    backends.result("web-1", False)
    backends.result("web-1", False)
    assert backends.candidates("web") == []  # both open: refuse now rather than wait on dead backends
    assert counters.total()["refused_breaker_open"] == 1
    clock.now += 6  # open_s passed: half-open, one probe each
    probe = backends.candidates("web")
    assert {i.id for i in probe} == {"web-0", "web-1"}
    backends.result("web-0", True)
    assert counters.total()["breaker_closed"] == 1


def test_without_breakers_results_change_nothing():
    backends, _, counters, _ = make([web(0)])
    for _ in range(10):
        backends.result("web-0", False)
    assert [i.id for i in backends.candidates("web")] == ["web-0"]
    assert counters.total()["breaker_opened"] == 0
