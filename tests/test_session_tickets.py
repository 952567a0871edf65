"""Fleet-wide session tickets: a ticket one worker's context issues resumes on another's, across a rotation.

Two ``SNIContexts`` stand for two workers: each builds its own SSL_CTX objects (OpenSSL would give each its
own random ticket keys); they share only the ticket-key region, as forked workers share the fleet's memory.
Time is injected into the ring, so a rotation is a clock move, not an hour's wait.
"""

from __future__ import annotations

import mmap
import multiprocessing
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from OpenSSL import SSL

from sentin8 import session_tickets, tls
from sentin8.certstore import CertStore
from sentin8.session_tickets import TicketSealer
from sentin8.ticketkeys import _SLOT, TicketKey, TicketKeyRing, _ratchet
from tests.pqclient import PQClient
from tests.test_tls import ServerThread, put_cert

SNI = "shop.example.test"
ROTATION = 3600.0


class WallClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> CertStore:
    return CertStore(tmp_path / "certs", tmp_path / "state")


@pytest.fixture
def serve() -> Iterator[Callable[..., ServerThread]]:
    servers: list[ServerThread] = []

    def start(context: SSL.Context) -> ServerThread:
        servers.append(ServerThread(context))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def shared_region() -> memoryview:
    mm = mmap.mmap(-1, TicketKeyRing.REGION_BYTES, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    return memoryview(mm)


def test_ring_rotates_deterministically_and_keeps_one_previous_key() -> None:
    view = shared_region()
    t = WallClock(1_000_000 * ROTATION)
    a = TicketKeyRing(view, ROTATION, t)
    a.seed()
    b = TicketKeyRing(view, ROTATION, t)  # another process, same memory
    cur_a, prev_a = a.keys()
    assert prev_a is None  # the fleet's first epoch
    assert b.keys()[0] == cur_a
    t.now += ROTATION
    cur_b, prev_b = b.keys()  # b ratchets first and writes the slot
    assert prev_b == cur_a and cur_b != cur_a
    assert a.keys() == (cur_b, prev_b)  # a reads what b wrote (or ratchets to the same bytes)
    assert a.lookup(cur_a.name) == (cur_a, False)
    assert a.lookup(cur_b.name) == (cur_b, True)
    t.now += 2 * ROTATION  # an idle fleet: two epochs skipped
    c = TicketKeyRing(view, ROTATION, t)
    assert a.lookup(cur_b.name) is None and c.lookup(cur_b.name) is None  # too old: full handshake
    assert a.keys() == c.keys()


def test_torn_slot_is_ignored_and_recomputed() -> None:
    view = shared_region()
    t = WallClock(5 * ROTATION)
    ring = TicketKeyRing(view, ROTATION, t)
    ring.seed()
    t.now += ROTATION
    expected = TicketKeyRing(view, ROTATION, t).keys()
    slot = 8 + (6 % 3) * _SLOT.size  # after the generation word
    view[slot + 10] ^= 0xFF  # a reader catches the slot mid-write: its digest disagrees
    assert TicketKeyRing(view, ROTATION, t).keys() == expected  # ratcheted again from the other slot


@pytest.mark.skipif(not session_tickets.available(), reason="bundled OpenSSL hook unreachable")
def test_ticket_from_one_worker_resumes_on_another_and_after_rotation(
    store: CertStore, serve: Callable[..., ServerThread]
) -> None:
    put_cert(Path(store.cert_dir), SNI, [SNI])
    view = shared_region()
    t = WallClock(2_000_000 * ROTATION + 10)
    TicketKeyRing(view, ROTATION, t).seed()
    sealers = [TicketSealer(TicketKeyRing(view, ROTATION, t)) for _ in range(2)]
    workers = [serve(tls.SNIContexts(store, tickets=s).front) for s in sealers]

    def connect(i: int, session: SSL.Session | None, ctx: SSL.Context | None) -> PQClient:
        c = workers[i].client(SNI, session=session, context=ctx)
        c.handshake()
        c.sendall(b"x")
        assert c.recv() == b"x"  # tickets arrive before the echo
        return c

    first = connect(0, None, None)
    assert not first.resumed
    session, ctx = first.session, first.context
    first.close()
    resumed = 0
    for n in range(20):  # alternate workers: every ticket crosses to the other one
        c = connect((n + 1) % 2, session, ctx)
        resumed += c.resumed
        session = c.session
        c.close()
    assert resumed == 20
    assert sealers[0].opened_current > 0 and sealers[1].opened_current > 0

    t.now += ROTATION  # rotation: the previous key still opens tickets, and a fresh ticket is issued
    c = connect(0, session, ctx)
    assert c.resumed
    assert sealers[0].opened_previous == 1
    session = c.session
    c.close()
    c = connect(1, session, ctx)
    assert c.resumed and sealers[1].opened_current > 0
    old = c.session
    c.close()

    t.now += 2 * ROTATION  # two rotations later the ticket is too old: a full handshake, not a failure
    c = connect(0, old, ctx)
    assert not c.resumed
    c.close()


def test_alpn_selects_http11_and_refuses_h2_only(store: CertStore, serve: Callable[..., ServerThread]) -> None:
    put_cert(Path(store.cert_dir), SNI, [SNI])
    server = serve(tls.SNIContexts(store).front)

    def client(protos: list[bytes] | None) -> PQClient:
        ctx = PQClient.make_context()
        if protos is not None:
            ctx.set_alpn_protos(protos)
        return server.client(SNI, context=ctx)

    c = client([b"h2", b"http/1.1"])
    c.handshake()
    assert c.conn.get_alpn_proto_negotiated() == b"http/1.1"
    c.close()

    c = client(None)  # no ALPN at all: fine, nothing negotiated
    c.handshake()
    assert c.conn.get_alpn_proto_negotiated() == b""
    c.close()

    c = client([b"h2"])
    with pytest.raises(SSL.Error) as info:
        c.handshake()
    assert "no application protocol" in str(info.value)  # the alert OpenSSL reports on the client side
    c.sock.close()
    server.wait_for(lambda: any("no application protocol" in e for e in server.errors))


def test_select_protocol_prefers_the_servers_order() -> None:
    assert tls.select_protocol([b"h2", b"http/1.1"]) == b"http/1.1"
    assert tls.select_protocol([b"http/1.1"]) == b"http/1.1"
    assert tls.select_protocol([b"h2", b"spdy/3"]) is None
    assert tls.select_protocol([]) is None


def test_private_symbols_are_proven_before_use(tmp_path: Path) -> None:
    from sentin8 import openssl_private

    found = openssl_private.resolve(("SSL_CTX_set_tlsext_ticket_key_evp_cb", "EVP_aes_256_cbc"))
    assert found is not None and all(found.values())
    assert openssl_private.resolve(("no_such_function_anywhere",)) is None  # unknown: no guess
    not_elf = tmp_path / "x.so"
    not_elf.write_bytes(b"\0" * 64)
    assert openssl_private.elf_symbols(str(not_elf), {"SSL_CTX_new"}) == {}


def _race_through_epochs(view: memoryview, start: int, count: int, out: multiprocessing.Queue) -> None:
    clock = WallClock(0.0)
    seen = []
    for e in range(start, start + count):
        clock.now = e * ROTATION
        current, previous = TicketKeyRing(view, ROTATION, clock).keys()  # a fresh process view each time
        seen.append(
            (current.epoch, current.name, previous.epoch if previous else None, previous.name if previous else b"")
        )
    out.put(seen)


def test_processes_ratcheting_at_once_never_see_a_wrong_key() -> None:
    """Three processes race through 1,500 rotations on the same three slots: every key any of them ever gets
    must be the one the sequential ratchet gives for its epoch (a torn slot must never become a key)."""
    view = shared_region()
    start = 10_000
    TicketKeyRing(view, ROTATION, WallClock(start * ROTATION)).seed()
    stored, secret = _SLOT.unpack_from(bytes(view[8 + (start % 3) * _SLOT.size :]))[:2]
    assert stored == start + 1
    reference = {}
    for e in range(start, start + 1_501):
        reference[e] = TicketKey.derive(e, secret).name
        secret = _ratchet(secret)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_race_through_epochs, args=(view, start, 1_500, out)) for _ in range(3)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    checked = 0
    for seen in results:
        for cur_epoch, cur_name, prev_epoch, prev_name in seen:
            assert reference[cur_epoch] == cur_name
            if prev_epoch is not None:
                assert reference[prev_epoch] == prev_name
            checked += 1
    assert checked == 4_500


@pytest.mark.skipif(not session_tickets.available(), reason="bundled OpenSSL hook unreachable")
def test_ticket_lifetime_hint_is_the_rotation_period(store: CertStore) -> None:
    ring = TicketKeyRing(shared_region(), 1800.0)
    ring.seed()
    sni = tls.SNIContexts(store, tickets=TicketSealer(ring))
    assert sni.front.get_timeout() == 1800


def counting_tickets(ctx: SSL.Context) -> list[int]:
    """Make a client context count the NewSessionTicket messages it receives (its message callback sees
    every decrypted handshake message); the returned one-element list is the count."""
    ffi, seen = SSL._ffi, [0]

    @ffi.callback("void(int, int, int, void *, size_t, SSL *, void *)")
    def on_message(write_p: int, _v: int, content_type: int, buf: object, n: int, _s: object, _a: object) -> None:
        if not write_p and content_type == 22 and n and ffi.cast("unsigned char *", buf)[0] == 4:
            seen[0] += 1

    SSL._lib.SSL_CTX_set_msg_callback(ctx._context, on_message)
    ctx._ticket_counter = on_message  # type: ignore[attr-defined]  # alive as long as the context
    return seen


@pytest.mark.parametrize("sealed", [True, False], ids=["fleet-keys", "openssl-keys"])
def test_one_ticket_per_handshake_and_resumption_stays_post_quantum(
    store: CertStore, serve: Callable[..., ServerThread], sealed: bool
) -> None:
    if sealed and not session_tickets.available():
        pytest.skip("bundled OpenSSL hook unreachable")
    put_cert(Path(store.cert_dir), SNI, [SNI])
    view = shared_region()
    TicketKeyRing(view, ROTATION).seed()
    sealers = [TicketSealer(TicketKeyRing(view, ROTATION)) if sealed else None for _ in range(2)]
    workers = [serve(tls.SNIContexts(store, tickets=s).front) for s in sealers]
    ctx = PQClient.make_context()
    tickets = counting_tickets(ctx)

    def connect(i: int, session: SSL.Session | None) -> PQClient:
        c = workers[i].client(SNI, session=session, context=ctx)
        c.handshake()
        c.sendall(b"x")
        assert c.recv() == b"x"  # the tickets arrive before the echo
        return c

    first = connect(0, None)
    assert not first.resumed and tickets[0] == 1  # OpenSSL's default would be 2
    session = first.session
    first.close()
    n = 6 if sealed else 1  # OpenSSL's own keys are per context: only the issuing worker opens its tickets
    for k in range(n):
        before = tickets[0]
        c = connect((k + 1) % 2 if sealed else 0, session)
        assert c.resumed
        assert c.group_name == "X25519MLKEM768"  # psk_dhe_ke: a resumption still runs the hybrid key exchange
        assert tickets[0] - before == 1  # and each resumption hands out the next ticket, just one
        session = c.session
        c.close()


def test_num_tickets_setter_is_reachable() -> None:
    ctx = tls.server_context()
    assert tls.set_num_tickets(ctx, 1)
    assert tls.set_num_tickets(ctx, 0)


def captured_tickets(ctx: SSL.Context) -> list[bytes]:
    """Make a client context keep the ticket of every NewSessionTicket message it receives (RFC 8446 §4.6.1:
    lifetime 4, age_add 4, nonce <1>, ticket <2>); the fleet's ticket starts with its key name and IV."""
    ffi, tickets = SSL._ffi, []

    @ffi.callback("void(int, int, int, void *, size_t, SSL *, void *)")
    def on_message(write_p: int, _v: int, content_type: int, buf: object, n: int, _s: object, _a: object) -> None:
        msg = bytes(ffi.buffer(buf, n)) if not write_p and content_type == 22 and n else b""
        if msg[:1] == b"\x04":
            at = 4 + 8
            at += 1 + msg[at]  # the nonce
            size = int.from_bytes(msg[at : at + 2], "big")
            tickets.append(msg[at + 2 : at + 2 + size])

    SSL._lib.SSL_CTX_set_msg_callback(ctx._context, on_message)
    ctx._ticket_keeper = on_message  # type: ignore[attr-defined]  # alive as long as the context
    return tickets


def test_every_sealed_ticket_has_its_own_random_iv(store: CertStore, serve: Callable[..., ServerThread]) -> None:
    """The IV comes from OpenSSL's CSPRNG straight into the ticket (no bytes object per ticket): one key name,
    and never the same IV twice, over full handshakes and resumptions alike."""
    if not session_tickets.available():
        pytest.skip("bundled OpenSSL hook unreachable")
    put_cert(Path(store.cert_dir), SNI, [SNI])
    ring = TicketKeyRing(shared_region(), ROTATION)
    ring.seed()
    sealer = TicketSealer(ring)
    worker = serve(tls.SNIContexts(store, tickets=sealer).front)
    ctx = PQClient.make_context()
    tickets = captured_tickets(ctx)
    session = None
    for k in range(8):
        c = worker.client(SNI, session=session if k % 2 else None, context=ctx)
        c.handshake()
        c.sendall(b"x")
        assert c.recv() == b"x"  # the ticket arrives before the echo
        assert c.resumed is bool(k % 2)
        session = c.session
        c.close()
    assert len(tickets) == 8 and sealer.sealed == 8 and sealer.errors == 0
    key, _ = ring.keys()
    assert {t[:16] for t in tickets} == {key.name}
    ivs = [t[16:32] for t in tickets]
    assert len(set(ivs)) == 8 and bytes(16) not in ivs
