"""The cluster's wrapped ticket ratchet: the KEK, wrap/unwrap, the epoch arithmetic, the ring's install (sans-IO);
then two hosts' ticket syncers on one real Valkey, with the clock moved across a rotation and a reseed."""

from __future__ import annotations

import asyncio
import mmap

import pytest

from sentin8.cluster import ticket_state as ts
from sentin8.cluster.ticket_state import TicketState, UnwrapError
from sentin8.config import load_bytes
from sentin8.shm.cluster import ClusterStatus
from sentin8.shm.cluster import region_bytes as status_bytes
from sentin8.ticketkeys import TicketKey, TicketKeyRing, ratchet
from supervisor.ticket_sync import TicketSync
from tests.topologies import valkey_group  # noqa: F401 - fixture

SECRET = b"s" * 40
HOUR = 3600.0


def test_wrap_unwraps_only_with_the_same_secret_and_cluster() -> None:
    state = TicketState(500_000, bytes(range(32)), 500_001, b"\x07" * 32)
    kek = ts.derive_kek(SECRET, "edge")
    blob = ts.wrap(kek, "edge", state)
    assert ts.unwrap(kek, "edge", blob) == state
    assert state.secret not in blob and state.seed not in blob  # never in the clear
    assert kek != ts.derive_kek(SECRET, "other") != ts.derive_kek(b"t" * 40, "edge")
    with pytest.raises(UnwrapError, match="does not authenticate"):
        ts.unwrap(ts.derive_kek(b"t" * 40, "edge"), "edge", blob)  # a wrong secret cannot unwrap
    with pytest.raises(UnwrapError, match="does not authenticate"):
        ts.unwrap(ts.derive_kek(SECRET, "other"), "other", blob)  # another cluster's blob
    with pytest.raises(UnwrapError, match="does not authenticate"):
        ts.unwrap(kek, "other", blob)  # the cluster id is in the AAD too


def test_tampered_truncated_or_reepoched_blob_is_refused() -> None:
    kek = ts.derive_kek(SECRET, "edge")
    blob = ts.wrap(kek, "edge", TicketState(42, b"k" * 32))
    for i in range(len(blob)):
        bad = bytearray(blob)
        bad[i] ^= 0x01
        with pytest.raises(UnwrapError):
            ts.unwrap(kek, "edge", bytes(bad))
    with pytest.raises(UnwrapError, match="bytes"):
        ts.unwrap(kek, "edge", blob[:-1])
    with pytest.raises(UnwrapError, match="format"):
        ts.unwrap(kek, "edge", b"XXXX" + blob[4:])
    moved = blob[:4] + (43).to_bytes(8, "little") + blob[12:]  # the epoch edited: bound by the AAD
    with pytest.raises(UnwrapError, match="does not authenticate"):
        ts.unwrap(kek, "edge", moved)


def test_advance_is_the_ratchet_and_applies_the_announced_reseed() -> None:
    s0 = b"a" * 32
    plain = ts.advance(TicketState(10, s0), 13)
    assert plain == TicketState(13, ratchet(ratchet(ratchet(s0))))
    seed = b"r" * 32
    announced = TicketState(10, s0, 12, seed)
    at12 = ts.advance(announced, 12)
    assert at12.secret == ts.reseed(ratchet(s0), seed) and at12.reseed_at == 0  # applied, then forgotten
    assert ts.advance(announced, 13).secret == ratchet(at12.secret)
    assert ts.advance(announced, 11) == TicketState(11, ratchet(s0), 12, seed)  # still ahead: kept
    assert ts.advance(announced, 9) is announced  # never backwards
    assert ts.reseed(ratchet(s0), seed) != ratchet(ratchet(s0))


def test_reseed_epochs_are_the_first_of_each_utc_day() -> None:
    e = int(1_700_000_000 // HOUR)  # some hour
    r = ts.reseed_epoch(e, HOUR)
    assert (r * HOUR) % 86400 == 0 and e < r <= e + 24
    assert ts.reseed_epoch(r - 1, HOUR) == r and ts.reseed_epoch(r, HOUR) == r + 24
    assert ts.reseed_epoch(5, 86400.0) == 6 and ts.reseed_epoch(5, 7 * 86400.0) == 6  # every epoch
    r7 = ts.reseed_epoch(100, 7000.0)  # not a divisor of a day: the first epoch starting after midnight
    assert r7 * 7000 >= ((100 * 7000) // 86400 + 1) * 86400 > (r7 - 1) * 7000


def test_announce_one_epoch_ahead_only() -> None:
    e = int(1_700_000_000 // HOUR)
    r = ts.reseed_epoch(e, HOUR)
    state = TicketState(e, b"b" * 32)
    assert ts.announce(state, r - 2, HOUR, b"n" * 32) is None  # not yet
    announced = ts.announce(state, r - 1, HOUR, b"n" * 32)
    assert announced is not None and announced.reseed_at == r and announced.epoch == r - 2
    assert ts.announce(announced, r - 1, HOUR, b"m" * 32) is None  # announced already: no second write
    assert ts.valid_through(state, HOUR) == r - 1
    assert ts.valid_through(announced, HOUR) == r + 23
    got = ts.secrets(announced, r - 1)  # previous, current and the announced next
    assert sorted(got) == [r - 2, r - 1, r]
    assert got[r] == ts.advance(announced, r).secret == ts.reseed(got[r - 1], b"n" * 32)
    assert sorted(ts.secrets(state, e)) == [e]  # the state's own epoch: no previous to give
    with pytest.raises(ValueError):
        ts.secrets(announced, r - 3)


def test_too_old_state_and_bad_states() -> None:
    assert ts.too_old(TicketState(1, b"c" * 32), 1 + ts.MAX_CATCH_UP + 1)
    assert not ts.too_old(TicketState(1, b"c" * 32), 1000)
    with pytest.raises(ValueError):
        TicketState(5, b"short")
    with pytest.raises(ValueError):
        TicketState(5, b"c" * 32, 5, b"n" * 32)  # a reseed must be ahead


def test_ring_install_replaces_every_processes_keys() -> None:
    view = memoryview(mmap.mmap(-1, TicketKeyRing.REGION_BYTES, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS))
    now = [1000 * HOUR + 5]
    a = TicketKeyRing(view, HOUR, lambda: now[0])
    a.seed()
    b = TicketKeyRing(view, HOUR, lambda: now[0])  # a worker, with its cache warm
    local = b.keys()[0]
    state = TicketState(990, b"d" * 32, 1001, b"e" * 32)
    a.install(ts.secrets(state, 1000))
    cur, prev = b.keys()
    assert cur != local and cur == TicketKey.derive(1000, ts.advance(state, 1000).secret)
    assert prev == TicketKey.derive(999, ts.advance(state, 999).secret)
    now[0] += HOUR  # the announced reseed is in shared memory already: nobody ratchets past it
    cur, prev = b.keys()
    assert cur == TicketKey.derive(1001, ts.advance(state, 1001).secret) and prev.epoch == 1000
    assert b.rotations == 0
    now[0] += HOUR  # then the plain ratchet again, by whichever process comes first
    assert b.keys()[0] == TicketKey.derive(1002, ts.advance(state, 1002).secret)
    a.install({1002: b"f" * 32})  # one epoch only: the other slots are emptied, no stale previous key
    assert b.keys() == (TicketKey.derive(1002, b"f" * 32), None)
    with pytest.raises(ValueError):
        a.install({1: b"x" * 32, 5: b"y" * 32})


# ---- two hosts' syncers, one real Valkey, the clock moved across a rotation and a reseed ------------------


def _host(url: str, node: str, clock, sources: str = "") -> tuple[TicketKeyRing, TicketSync, ClusterStatus]:
    where = f'valkey_url = "{url}"' if url else ""
    cfg = load_bytes(f'{sources}\n[cluster]\nenabled = true\nnode_id = "{node}"\n{where}\n'.encode())
    ring = TicketKeyRing(
        memoryview(mmap.mmap(-1, TicketKeyRing.REGION_BYTES, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)), HOUR, clock
    )
    ring.seed()
    st = ClusterStatus(memoryview(mmap.mmap(-1, status_bytes(), flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)))
    return ring, TicketSync(cfg, ring, st, SECRET), st


def test_the_ticket_state_is_shared_in_every_valkey_mode(valkey_group) -> None:  # noqa: F811
    """A 3-master Valkey Cluster, then behind Sentinel: the state's one key, SET NX and the CAS script."""
    r = ts.reseed_epoch(int(1_700_000_000 // HOUR), HOUR)
    now = [(r - 2) * HOUR + 5]
    sources = f"[sources]\n{valkey_group.sources()}"

    async def main() -> None:
        ring_a, a, st_a = _host("", "a:443", lambda: now[0], sources)
        ring_b, b, st_b = _host("", "b:443", lambda: now[0], sources)
        assert a.target.mode in ("cluster", "sentinel")
        try:
            await a.cycle()
            await b.cycle()
            assert st_a.tickets_shared and st_b.tickets_shared and ring_a.keys() == ring_b.keys()
            now[0] += HOUR  # the announcement through the CAS script
            await a.cycle()
            await b.cycle()
            assert set(ring_a.slots()) == set(ring_b.slots()) == {r - 2, r - 1, r}
            now[0] += HOUR
            assert ring_a.keys() == ring_b.keys() and ring_a.keys()[0].epoch == r
        finally:
            await a._drop()
            await b._drop()

    asyncio.run(main())


def test_two_hosts_share_keys_across_a_rotation_and_a_reseed(redis_server) -> None:
    start = 1_700_000_000.0
    r = ts.reseed_epoch(int(start // HOUR), HOUR)
    now = [(r - 2) * HOUR + 10]  # two epochs before a reseed

    def clock() -> float:
        return now[0]

    async def main() -> None:
        ring_a, a, st_a = _host(redis_server.url, "a:443", clock)
        ring_b, b, st_b = _host(redis_server.url, "b:443", clock)
        first_a = ring_a.keys()[0]
        await a.cycle()  # the first host: its own keys become the cluster's (SET NX)
        assert ring_a.keys()[0] == first_a and st_a.tickets_shared
        await b.cycle()  # the second adopts them
        assert ring_b.keys()[0] == first_a and st_b.tickets_shared
        blob = redis_server.client().get(ts.state_key("default"))
        assert first_a.aes_key not in blob and first_a.hmac_key not in blob

        now[0] += HOUR  # a plain rotation, into the epoch before the reseed: it gets announced (once)
        await b.cycle()
        await a.cycle()
        state = ts.unwrap(
            ts.derive_kek(SECRET, "default"), "default", redis_server.client().get(ts.state_key("default"))
        )
        assert state.reseed_at == r and state.epoch == r - 2
        assert ring_a.keys() == ring_b.keys() and ring_a.keys()[1] == first_a
        assert set(ring_a.slots()) == set(ring_b.slots()) == {r - 2, r - 1, r}  # the next one installed ahead

        now[0] += HOUR  # the reseed epoch: nobody ratchets, both hosts hold the announced secret already
        cur_a, cur_b = ring_a.keys()[0], ring_b.keys()[0]
        assert cur_a == cur_b and cur_a.epoch == r
        assert cur_a != TicketKey.derive(r, ratchet(ring_a.slots()[r - 1]))  # fresh randomness, not the ratchet
        assert ring_a.rotations == ring_b.rotations == 0

        await a._drop()
        await b._drop()

    asyncio.run(main())


def test_unreachable_valkey_keeps_shared_until_a_missed_reseed(redis_server) -> None:
    r = ts.reseed_epoch(int(1_700_000_000 // HOUR), HOUR)
    now = [(r - 3) * HOUR]

    async def main() -> None:
        ring, sync, st = _host(redis_server.url, "a:443", lambda: now[0])
        await sync.cycle()
        assert st.tickets_shared
        redis_server.stop(kill=True)
        await sync.first()  # fails fast: still the cluster's keys (no reseed passed)
        assert st.tickets_shared
        now[0] = r * HOUR + 1  # the reseed passed unseen: this host's keys are its own now
        await sync.first()
        assert not st.tickets_shared and ring.keys()[0].epoch == r  # and it still seals: a local ratchet
        await sync._drop()

    asyncio.run(main())
