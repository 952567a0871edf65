"""``workers.peek`` with PROXY v2: the header read before the ClientHello peek, on a real uvloop loop over real
loopback TCP sockets. The header is consumed and only it (the hello stays for TLS); every bad header is closed
within the deadline with a FIN and no answer; a PROXY signature where a hello belongs is refused as such."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import pytest
import uvloop

from sentin8 import proxy_protocol as pp
from sentin8 import refusals
from tests.hellos import pq_hello
from workers.peek import PeekFailed, peek_client_hello, read_proxy_header

HELLO = pq_hello("db.internal.test")
HEADER = pp.encode_proxy(("198.18.7.9", 51000), ("10.0.0.5", 443))


@pytest.fixture
def loop():
    loop = uvloop.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture
def pair():
    """(client, server side): a connected loopback TCP pair, the server side non-blocking like an accepted one."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    server, _ = listener.accept()
    server.setblocking(False)
    listener.close()
    yield client, server
    client.close()
    server.close()


def dribble(loop, client: socket.socket, data: bytes, step: int, every_s: float = 0.005) -> None:
    """Send ``data`` in ``step``-byte pieces from the loop, one every ``every_s`` (a slow peer's shape); each
    piece schedules the next, so they leave in order."""

    def send(at: int) -> None:
        client.send(data[at : at + step])
        if at + step < len(data):
            loop.call_later(every_s, send, at + step)

    loop.call_soon(send, 0)


def closed_with_fin(client: socket.socket) -> bool:
    """The server side closed with a FIN and sent nothing (no TLS alert: a PROXY refusal is answered by none)."""
    client.settimeout(5)
    try:
        return client.recv(100) == b""
    except ConnectionResetError:
        return False


async def both(loop, server, timeout: float = 2.0):
    """What the worker does for a trusted source: the header, then the hello, within one deadline."""
    deadline = loop.time() + timeout
    header = await read_proxy_header(loop, server, deadline)
    hello = await peek_client_hello(loop, server, 32768, deadline - loop.time(), refuse_proxy=False)
    return header, hello


def read_both(loop, server, timeout: float = 2.0):
    return loop.run_until_complete(both(loop, server, timeout))


def inet_header(body_after_addresses: bytes) -> bytes:
    body = HEADER[16:] + body_after_addresses
    return pp.SIGNATURE + b"\x21\x11" + len(body).to_bytes(2, "big") + body


def failure(loop, coro) -> PeekFailed:
    with pytest.raises(PeekFailed) as info:
        loop.run_until_complete(coro)
    return info.value


def test_header_and_hello_in_one_segment(loop, pair):
    client, server = pair
    client.sendall(HEADER + HELLO)
    header, hello = read_both(loop, server)
    assert header.client() == ("198.18.7.9", 51000) and header.destination() == ("10.0.0.5", 443)
    assert hello.sni == "db.internal.test"
    assert server.recv(65536, socket.MSG_PEEK) == HELLO  # the header consumed, the hello left for TLS


@pytest.mark.parametrize("step", [1, 7, 16, 100])
def test_header_and_hello_dribbled(loop, pair, step):
    client, server = pair
    dribble(loop, client, HEADER + HELLO, step, every_s=0.001 if step < 16 else 0.005)
    header, hello = read_both(loop, server, timeout=30)
    assert header.src_addr == "198.18.7.9" and hello.sni == "db.internal.test"
    assert server.recv(65536, socket.MSG_PEEK) == HELLO


def test_local_header(loop, pair):
    client, server = pair
    client.sendall(pp.encode_local() + HELLO)
    header, hello = read_both(loop, server)
    assert header.command == pp.LOCAL and header.client() is None and hello.sni == "db.internal.test"


@pytest.mark.parametrize(
    ("data", "refusal"),
    [
        (HELLO, refusals.PROXY_MISSING),
        (b"PROXY TCP4 198.18.7.9 10.0.0.5 51000 443\r\n" + HELLO, refusals.PROXY_V1),
        (pp.SIGNATURE + b"\x21\x11\xff\xff", refusals.PROXY_OVERSIZE),  # judged on its 16 bytes
        (pp.SIGNATURE + b"\x31\x11\x00\x0c" + bytes(12) + HELLO, refusals.PROXY_MALFORMED),  # version 3
        (inet_header(b"\x04\x00\x05abc") + HELLO, refusals.PROXY_MALFORMED),  # an overrunning TLV
    ],
    ids=["no-header", "v1", "oversize", "version", "tlv"],
)
def test_bad_headers_are_refused_with_a_fin(loop, pair, data, refusal):
    client, server = pair
    client.sendall(data)
    exc = failure(loop, read_proxy_header(loop, server, loop.time() + 2))
    assert exc.refusal is refusal
    server.close()
    assert closed_with_fin(client)


def test_a_slow_header_is_closed_at_the_deadline_and_the_loop_keeps_running(loop, pair):
    client, server = pair
    client.sendall(HEADER[:10])
    ticks = []

    async def other_work():  # the worker's other connections: served while this one waits
        while True:
            ticks.append(loop.time())
            await asyncio.sleep(0.01)

    ticker = loop.create_task(other_work())
    started = time.monotonic()
    exc = failure(loop, read_proxy_header(loop, server, loop.time() + 0.3))
    waited = time.monotonic() - started
    ticker.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        loop.run_until_complete(ticker)
    assert exc.refusal is refusals.PROXY_TIMEOUT
    assert 0.25 <= waited < 1.0
    assert len(ticks) >= 10  # never a stall
    server.close()
    assert closed_with_fin(client)


def test_one_deadline_covers_header_and_hello(loop, pair):
    """A header on time and a hello that never completes: closed when the one peek deadline passes."""
    client, server = pair
    client.sendall(HEADER + HELLO[:100])
    started = time.monotonic()
    exc = failure(loop, both(loop, server, timeout=0.3))
    assert exc.reason == "peek_timeout" and time.monotonic() - started < 1.0


def test_truncated_header_then_fin(loop, pair):
    client, server = pair
    client.sendall(HEADER[:20])
    client.shutdown(socket.SHUT_WR)
    started = time.monotonic()
    exc = failure(loop, read_proxy_header(loop, server, loop.time() + 5))
    assert exc.refusal is refusals.PROXY_TRUNCATED and time.monotonic() - started < 1


@pytest.mark.parametrize(
    "data",
    [HEADER + HELLO, b"PROXY TCP4 198.18.7.9 10.0.0.5 51000 443\r\n" + HELLO, pp.SIGNATURE],
    ids=["v2", "v1", "signature-only"],
)
def test_a_proxy_header_from_an_untrusted_source_is_refused(loop, pair, data):
    client, server = pair
    client.sendall(data)
    exc = failure(loop, peek_client_hello(loop, server, 32768, 2))
    assert exc.refusal is refusals.PROXY_UNTRUSTED
    server.close()
    assert closed_with_fin(client)


def test_a_signature_arriving_in_pieces_is_still_recognised(loop, pair):
    client, server = pair
    dribble(loop, client, HEADER + HELLO, 1, every_s=0.002)
    exc = failure(loop, peek_client_hello(loop, server, 32768, 5))
    assert exc.refusal is refusals.PROXY_UNTRUSTED


def test_half_a_signature_then_fin_is_a_refused_hello(loop, pair):
    client, server = pair
    client.sendall(pp.SIGNATURE[:5])
    client.shutdown(socket.SHUT_WR)
    exc = failure(loop, peek_client_hello(loop, server, 32768, 5))
    assert exc.refusal is None and exc.reason == "peek_garbage"


def test_a_second_header_after_the_first_is_garbage(loop, pair):
    client, server = pair
    client.sendall(HEADER + HEADER + HELLO)
    exc = failure(loop, both(loop, server))
    assert exc.reason == "peek_garbage"
