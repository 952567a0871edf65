"""Backend selection with a fake clock and an in-memory suspect table (the shared one is tested separately)."""

from __future__ import annotations

from sentin8.routing import Instance
from sentin8.selection import Selector, eligible
from sentin8.shm.suspects import SuspectTable


class Marks:
    def __init__(self) -> None:
        self.until: dict[str, int] = {}

    def suspect_until(self, instance_id: str) -> int:
        return self.until.get(instance_id, 0)

    def mark(self, instance_id: str, until_us: int) -> None:
        self.until[instance_id] = until_us


def inst(i: str, state: str = "Active", health_ts: float | None = None) -> Instance:
    return Instance(i, "svc", "127.0.0.1", 1, state, health_ts)


def test_round_robin_rotates_the_start():
    sel = Selector(Marks(), 30, 30)
    pool = [inst("a"), inst("b"), inst("c")]
    firsts = [sel.order("svc", pool, 1000.0)[0][0].id for _ in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]


def test_only_active_and_fresh_instances():
    now = 1000.0
    pool = [inst("a", "Draining"), inst("b", health_ts=now - 31), inst("c", health_ts=now - 29), inst("d")]
    assert [i.id for i in eligible(pool, now, 30)] == ["c", "d"]
    # freshness is judged at pick time: the same snapshot later has fewer eligible instances
    assert [i.id for i in eligible(pool, now + 2, 30)] == ["d"]


def test_suspects_go_last_and_expire():
    marks = Marks()
    sel = Selector(marks, 30, 30)
    pool = [inst("a"), inst("b")]
    sel.mark_suspect("a", 1000.0)
    for _ in range(4):
        order, all_suspect = sel.order("svc", pool, 1010.0)
        assert [i.id for i in order] == ["b", "a"] and not all_suspect
    order, _ = sel.order("svc", pool, 1031.0)  # 30 s TTL passed
    assert {i.id for i in order[:1]} <= {"a", "b"} and marks.suspect_until("a") < 1031e6


def test_all_suspect_falls_back_to_plain_round_robin():
    sel = Selector(Marks(), 30, 30)
    pool = [inst("a"), inst("b")]
    sel.mark_suspect("a", 1000.0)
    sel.mark_suspect("b", 1000.0)
    seen = []
    for _ in range(4):
        order, all_suspect = sel.order("svc", pool, 1001.0)
        assert all_suspect and len(order) == 2
        seen.append(order[0].id)
    assert seen == ["a", "b", "a", "b"]


def test_no_eligible_instance_gives_empty_order():
    sel = Selector(Marks(), 30, 30)
    assert sel.order("svc", [inst("a", "Draining")], 1.0) == ([], False)


def test_shared_suspect_table_round_trip_and_bounded():
    import mmap

    mm = mmap.mmap(-1, SuspectTable.region_bytes(64))
    table = SuspectTable(memoryview(mm), 64)
    table.mark("x", 5)
    assert table.suspect_until("x") == 5
    table.mark("x", 9)
    assert table.suspect_until("x") == 9
    for i in range(10_000):  # a flood of ids never grows memory; the most recent marks survive
        table.mark(f"id-{i}", 1_000_000 + i)
    assert table.suspect_until("id-9999") == 1_009_999
    table.clear("id-9999")
    assert table.suspect_until("id-9999") == 0


def test_cached_eligibility_still_expires_a_stale_heartbeat_on_time():
    sel = Selector(Marks(), 30, 30)
    pool = [inst("a", health_ts=1000.0), inst("b", health_ts=1010.0)]
    assert {i.id for i in sel.order("svc", pool, 1020.0)[0]} == {"a", "b"}
    assert {i.id for i in sel.order("svc", pool, 1029.9)[0]} == {"a", "b"}
    assert [i.id for i in sel.order("svc", pool, 1030.0)[0]] == ["b"]  # a's heartbeat is 30 s old now
    assert sel.order("svc", pool, 1040.0)[0] == []
    fresh = [inst("a", health_ts=1039.0)]  # a new snapshot (a new list) is judged afresh
    assert [i.id for i in sel.order("svc", fresh, 1040.0)[0]] == ["a"]


def test_health_clock_stands_still_while_the_registry_is_down_and_resumes_behind():
    from sentin8.routing import RoutingTable

    fresh_s = 30.0
    pool = [inst("a", health_ts=1000.0)]
    live = RoutingTable()
    assert live.health_clock(2000.0) == 2000.0
    down = RoutingTable(stale=True, health_frozen_at=1010.0)
    # an hour into the outage, the instance is judged as at the last good read: still eligible
    assert eligible(pool, down.health_clock(4600.0), fresh_s) == pool
    sel = Selector(Marks(), fresh_s, 30)
    assert sel.order("svc", pool, 4600.0, down.health_clock(4600.0))[0] == pool
    # back after 3590 s of outage: for one freshness window the clock runs that far behind wall time
    back = RoutingTable(health_lag_s=3590.0, health_lag_until=4630.0)
    assert eligible(pool, back.health_clock(4601.0), fresh_s) == pool
    # then wall time rules again: a heartbeat Captain never refreshed is stale
    assert eligible(pool, back.health_clock(4631.0), fresh_s) == []
    assert eligible(pool, live.health_clock(1031.0), fresh_s) == []
