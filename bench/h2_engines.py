"""The HTTP/2 engine, chosen by measurement (issue 17 §5): CPU per request, behaviour, attack answers.

    .venv/bin/python -m bench.h2_engines [--requests 20000] [--repeat 5]

All in memory, server side, on one connection: a python-hyper ``h2`` client HPACK-encodes browser-like
requests (Chrome's pseudo-header order and 16 fields, a new path each time), the server decodes each HEADERS
and answers HEADERS + 100 B DATA. The client's bytes are recorded once per engine (they depend on the
server's SETTINGS and windows), then replayed into a fresh server under ``time.process_time``: what is
timed is the server's protocol work alone. Engines: python-hyper ``h2`` (server role), ``ngh2`` used
directly, and our adapter path (``sentin8.http.h2_engine`` + ``h2_request.map_request``).

Then the behavioural claims of the issue, checked on both engines with hand-built frames, and the attack
families of issue 17 §3 against our adapter + budgets (``drive``; tests/test_h2_attacks.py asserts the same
table). Prints markdown for bench/README.md.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable, Iterable, Iterator

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import ngh2

from sentin8.http.h2_budget import CLOSE, GOAWAY, REFUSE, StreamBudget
from sentin8.http.h2_engine import (
    FIELDS_CHECKED,
    ConnectionEnded,
    H2Limits,
    RequestData,
    RequestHeaders,
    ServerConnection,
    StreamRefused,
    StreamReset,
)
from sentin8.http.h2_request import H2Refusal, map_request
from tests import h2frames as F
from tests.h2frames import RawFrames, kinds, parse, request_fields

BODY = b"x" * 100
RESPONSE = [(b"content-type", b"text/plain"), (b"content-length", b"100"), (b"cache-control", b"max-age=60")]


def chrome_request(i: int) -> list[tuple[bytes, bytes]]:
    return [
        (b":method", b"GET"),
        (b":authority", b"www.example.com"),
        (b":scheme", b"https"),
        (b":path", b"/static/app/%d.js?v=3f2a9c" % i),
        (b"sec-ch-ua", b'"Chromium";v="124", "Google Chrome";v="124", "Not-A.Brand";v="99"'),
        (b"sec-ch-ua-mobile", b"?0"),
        (b"user-agent", b"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0"),
        (b"sec-ch-ua-platform", b'"Linux"'),
        (b"accept", b"*/*"),
        (b"sec-fetch-site", b"same-origin"),
        (b"sec-fetch-mode", b"no-cors"),
        (b"sec-fetch-dest", b"script"),
        (b"referer", b"https://www.example.com/products/shoes?color=blue"),
        (b"accept-encoding", b"gzip, deflate, br, zstd"),
        (b"accept-language", b"en-US,en;q=0.9,de;q=0.8"),
        (b"cookie", b"_ga=GA1.1.1234567890.1700000000"),
        (b"cookie", b"session=4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c"),
        (b"cookie", b"theme=dark"),
        (b"priority", b"u=1"),
    ]


# -- the servers under test: (initial bytes, feed(bytes) -> bytes) -------------------------------------

Server = tuple[bytes, Callable[[bytes], bytes]]


def h2_server() -> Server:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
    conn.initiate_connection()
    head = [(b":status", b"200"), *RESPONSE]

    def feed(data: bytes) -> bytes:
        for ev in conn.receive_data(data):
            if type(ev) is h2.events.RequestReceived:
                conn.send_headers(ev.stream_id, head)
                conn.send_data(ev.stream_id, BODY, end_stream=True)
            elif type(ev) is h2.events.DataReceived:
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        return conn.data_to_send()

    return conn.data_to_send(), feed


def ngh2_server() -> Server:
    conn = ngh2.Connection(ngh2.Role.SERVER, ngh2.Configuration(auto_window_update=False))
    conn.initiate_connection({ngh2.Setting.MAX_CONCURRENT_STREAMS: 100})
    head = [(b":status", b"200"), *RESPONSE]

    def feed(data: bytes) -> bytes:
        conn.receive_data(data)
        for ev in conn.events():
            if type(ev) is ngh2.RequestReceived:
                conn.send_response(ev.stream_id, head)
                conn.send_data(ev.stream_id, BODY, end_stream=True)
        return conn.data_to_send()

    return conn.data_to_send(), feed


def adapter_server(mapping: bool = True) -> Server:
    conn = ServerConnection(H2Limits())

    def feed(data: bytes) -> bytes:
        for ev in conn.receive(data):
            if type(ev) is RequestHeaders:
                sid = ev.stream_id
                if mapping:
                    map_request(ev.fields, ev.end_stream, max_headers=100, fields_checked=FIELDS_CHECKED)
                conn.send_head(sid, 200, RESPONSE)
                conn.send_data(sid, BODY, end_stream=True)
        return conn.data_to_send()

    return conn.data_to_send(), feed


# key -> (label, server factory)
ENGINES: dict[str, tuple[str, Callable[[], Server]]] = {
    "h2": (f"python-hyper h2 {h2.__version__}", h2_server),
    "ngh2": (f"ngh2 {ngh2.__version__}", ngh2_server),
    "adapter": (f"sentin8 adapter (ngh2 {ngh2.__version__}) + map_request", adapter_server),
    "adapter_alone": (f"sentin8 adapter (ngh2 {ngh2.__version__}) alone", lambda: adapter_server(mapping=False)),
}


def record(make: Callable[[], Server], requests: int, batch: int) -> list[bytes]:
    """The client's bytes for ``requests`` requests, ``batch`` at a time, as one real exchange made them."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    initial, feed = make()
    client.receive_data(initial)
    chunks = []
    done = 0
    while done < requests:
        for _ in range(min(batch, requests - done)):
            sid = client.get_next_available_stream_id()
            client.send_headers(sid, chrome_request(done), end_stream=True)
            done += 1
        chunk = client.data_to_send()
        chunks.append(chunk)
        for ev in client.receive_data(feed(chunk)):
            if type(ev) is h2.events.DataReceived:
                client.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
    return chunks


def replay_us(make: Callable[[], Server], chunks: list[bytes], requests: int) -> float:
    """CPU-µs per request of a fresh server fed the recorded bytes."""
    _initial, feed = make()
    gc.collect()
    t0 = time.process_time()
    for chunk in chunks:
        feed(chunk)
    return (time.process_time() - t0) * 1e6 / requests


def measure(
    requests: int, repeat: int, batches: Iterable[int] = (1, 10), only: list[str] | None = None
) -> list[tuple[str, dict[int, float]]]:
    rows = []
    for key, (name, make) in ENGINES.items():
        if only and key not in only:
            continue
        cells = {}
        for batch in batches:
            chunks = record(make, requests, batch)
            cells[batch] = statistics.median(replay_us(make, chunks, requests) for _ in range(repeat))
        rows.append((name, cells))
    return rows


# -- the behavioural claims, on both engines ----------------------------------------------------


def _h2_raw(data: bytes) -> tuple[str, bytes]:
    """python-hyper h2 as a server fed raw bytes: what it raised (if anything) and what it wrote."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    conn.initiate_connection()
    conn.data_to_send()
    try:
        conn.receive_data(data)
        raised = ""
    except h2.exceptions.ProtocolError as exc:
        raised = type(exc).__name__
    return raised, conn.data_to_send()


def _ngh2_raw(data: bytes) -> bytes:
    conn = ngh2.Connection(ngh2.Role.SERVER, ngh2.Configuration(auto_window_update=False))
    conn.initiate_connection({ngh2.Setting.MAX_CONCURRENT_STREAMS: 100})
    conn.data_to_send()
    try:
        conn.receive_data(data)
    except ngh2.NGH2Error as exc:
        return f"raises {type(exc).__name__}".encode()
    return conn.data_to_send()


def _frames(out: bytes) -> str:
    if out.startswith(b"raises"):
        return out.decode()
    counted = kinds(parse(out)[0])
    counted.pop("Settings", None)
    return ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(counted.items())) or "nothing"


def claims() -> list[tuple[str, str, str]]:
    """(claim, python-hyper h2, ngh2): the frames each writes back (GoAway(n)/RstStream(n) carry the code)."""
    rows = []
    r = RawFrames()
    bad = F.preface() + r.headers(1, [*request_fields(), (b"X-Upper", b"1")]) + r.headers(3)
    raised, out = _h2_raw(bad)
    rows.append(
        ("malformed request (uppercase name), then a good one", f"{raised}: {_frames(out)}", _frames(_ngh2_raw(bad)))
    )
    for acked in (False, True):
        r = RawFrames()
        over = F.preface(ack=acked) + b"".join(r.headers(1 + 2 * i, end_stream=False) for i in range(101))
        raised, out = _h2_raw(over)
        when = "after" if acked else "before"
        rows.append(
            (
                f"101 open streams, limit 100, {when} the client ACKs it",
                f"{raised}: {_frames(out)}",
                _frames(_ngh2_raw(over)),
            )
        )
    r = RawFrames()
    resets = F.preface() + b"".join(r.headers(1 + 2 * i, end_stream=False) + F.rst(1 + 2 * i) for i in range(10_000))
    raised, out = _h2_raw(resets)
    rows.append(
        (
            "10,000 HEADERS + RST_STREAM (rapid reset)",
            f"{raised or 'no error'}: {_frames(out)}",
            _frames(_ngh2_raw(resets)),
        )
    )
    rows.append(("send on in-flight streams after GOAWAY", _h2_after_close(), _ngh2_after_goaway()))
    r = RawFrames()
    block = r.block([*request_fields(), (b"x-a", b"y" * 100)])
    cont = F.preface() + r.headers(1, block=block[:10], end_headers=False)
    cont += b"".join(F.continuation(1, block[10 + i : 11 + i]) for i in range(40))
    raised, out = _h2_raw(cont)
    rows.append(("40 CONTINUATION frames", f"{raised or 'no error'}: {_frames(out)}", _frames(_ngh2_raw(cont))))
    r = RawFrames()
    bomb = F.preface() + r.headers(1, [*request_fields(), *([(b"a", b"")] * 5000)])
    raised, out = _h2_raw(bomb)
    rows.append(
        ("5,000 one-byte header references", f"{raised or 'accepted'}: {_frames(out)}", _frames(_ngh2_raw(bomb)))
    )
    prio = F.preface() + b"".join(F.priority(1 + 2 * (i % 500), 0) for i in range(20_000))
    raised, out = _h2_raw(prio)
    rows.append(("20,000 PRIORITY frames", f"{raised or 'no error'}: {_frames(out)}", _frames(_ngh2_raw(prio))))
    return rows


def _h2_after_close() -> str:
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    server.initiate_connection()
    r = RawFrames()
    server.receive_data(F.preface() + r.headers(1, end_stream=True))
    server.close_connection()
    try:
        server.send_headers(1, [(b":status", b"200")], end_stream=True)
    except h2.exceptions.ProtocolError as exc:
        return f"{type(exc).__name__}: {exc}"[:90]
    return "sent"


def _ngh2_after_goaway() -> str:
    server = ngh2.Connection(ngh2.Role.SERVER, ngh2.Configuration())
    server.initiate_connection()
    r = RawFrames()
    server.receive_data(F.preface() + r.headers(1, end_stream=True))
    server.events()
    server.send_goaway(0, last_stream_id=1)
    server.send_response(1, [(b":status", b"200")], end_stream=True)
    return "sent: " + _frames(server.data_to_send())


# -- the attack families against our adapter + budgets --------------------------------------------------


def drive(
    frames: Iterator[bytes], *, read_size: int = 16384, budget_bytes: int = 64 << 20
) -> tuple[str, int, int, float]:
    """A minimal shell: reads of ``read_size`` bytes into the adapter, every verdict of the budget obeyed,
    exchanges aborted as soon as their stream is reset (the best a shell can do), none ever completing
    otherwise (a slow upstream), DATA consumed at once (a fast one). Returns (the counter that ended it,
    bytes read by then, frames sent by then, the server side's CPU seconds: frame building not counted)."""
    conn = ServerConnection(H2Limits())
    budget = StreamBudget()
    conn.data_to_send()
    buf = bytearray(F.preface())
    sent = read = 0
    cpu = 0.0
    exhausted = False
    while read < budget_bytes:
        while len(buf) < read_size and not exhausted:
            try:
                buf += next(frames)
                sent += 1
            except StopIteration:
                exhausted = True
        if not buf:
            break
        chunk, buf = bytes(buf[:read_size]), buf[read_size:]
        read += len(chunk)
        t0 = time.process_time()
        answer = _serve_read(conn, budget, chunk)
        cpu += time.process_time() - t0
        if answer:
            return answer, read, sent, cpu
    return "survived", read, sent, cpu


def _serve_read(conn: ServerConnection, budget: StreamBudget, chunk: bytes) -> str:
    budget.begin_read()
    events = conn.receive(chunk)
    if conn.events_waiting:  # what the last send produced (a stream the engine reset on writing it)
        events = conn.take_events() + events
    for ev in events:
        verdict = None
        if type(ev) is RequestHeaders:
            verdict = budget.opened(ev.stream_id, 0.0)
            if verdict is None or verdict.action == GOAWAY:
                try:
                    map_request(ev.fields, ev.end_stream, max_headers=100, fields_checked=FIELDS_CHECKED)
                except H2Refusal:
                    conn.reset(ev.stream_id, 1)
                    budget.reset_by_us(ev.stream_id)
                if verdict is not None:
                    conn.goaway()
            elif verdict.action == REFUSE:
                conn.refuse(ev.stream_id)
        elif type(ev) is RequestData:
            conn.consume(ev.stream_id, ev.flow)  # a fast upstream
        elif type(ev) is StreamReset:
            verdict = budget.reset_by_peer(ev.stream_id, 0.0)
            budget.done(ev.stream_id)  # the exchange is aborted at once
        elif type(ev) is StreamRefused:
            verdict = budget.refused(0.0)
        elif type(ev) is ConnectionEnded:
            return f"engine: {ev.reason or 'clean'}"
        if verdict is not None and verdict.action == CLOSE:
            conn.close(verdict.code, verdict.counter)
            return f"budget: {verdict.counter}"
    verdict = budget.after_read(conn.received, conn.payload, conn.control)
    if verdict is not None:
        conn.close(verdict.code, verdict.counter)
        return f"budget: {verdict.counter}"
    conn.data_to_send()
    if conn.ended is not None:
        return f"engine: {conn.ended.reason or 'clean'}"
    return ""


def _streams(make: Callable[[RawFrames, int], bytes]) -> Iterator[bytes]:
    r = RawFrames()
    i = 0
    while True:
        yield make(r, 1 + 2 * i)
        i += 1


def _repeat(frame: bytes, first: bytes = b"") -> Iterator[bytes]:
    if first:
        yield first
    while True:
        yield frame


def _continuation() -> Iterator[bytes]:
    r = RawFrames()
    yield r.headers(1, block=r.block(request_fields())[:5], end_headers=False)
    yield from _repeat(F.continuation(1, b""))


def _bomb() -> Iterator[bytes]:
    r = RawFrames()
    yield r.headers(1, [*request_fields(), *([(b"a", b"")] * 300)])


def _big_header() -> Iterator[bytes]:
    r = RawFrames()
    fields = [*request_fields(), *((b"x-h%d" % i, b"v" * 8000) for i in range(9))]
    block = r.block(fields)
    yield r.headers(1, block=block[:16000], end_headers=False)
    for at in range(16000, len(block), 16000):
        yield F.continuation(1, block[at : at + 16000], end_headers=at + 16000 >= len(block))


CL = (b"content-length", b"1")


def _headers_then(make: Callable[[RawFrames, int], bytes]) -> Callable[[], Iterator[bytes]]:
    return lambda: _streams(make)


_POST = request_fields(method=b"POST")

# (family, CVEs, frames, {read size: the answer documented in bench/README.md}, bound on bytes read)
# Two read sizes: a TLS record (16 KiB, what a shell gets from a fast sender) and 100 B (a client dripping
# frames, which sidesteps per-read engine limits and meets the per-frame ones and the budgets).
# fmt: off
FAMILIES: list[tuple[str, str, Callable[[], Iterator[bytes]], dict[int, str], int]] = [
    ("Rapid Reset: HEADERS + RST_STREAM", "CVE-2023-44487",
     _headers_then(lambda r, s: r.headers(s, end_stream=False) + F.rst(s)),
     {16384: "budget: h2_premature_resets", 100: "budget: h2_premature_resets"}, 16_384),
    ("MadeYouReset: DATA beyond content-length", "CVE-2025-8671",
     _headers_then(lambda r, s: r.headers(s, [*_POST, CL], end_stream=False) + F.data(s, b"xx", end_stream=True)),
     {16384: "budget: h2_premature_resets", 100: "budget: h2_premature_resets"}, 16_384),
    ("MadeYouReset: WINDOW_UPDATE overflow", "CVE-2025-8671",
     _headers_then(lambda r, s: r.headers(s, end_stream=False) + F.window_update(s, (1 << 31) - 1)),
     {16384: "engine: h2_flow_control_error", 100: "engine: h2_flow_control_error"}, 16_384),
    ("streams beyond the acknowledged cap", "CVE-2023-44487",
     _headers_then(lambda r, s: r.headers(s, end_stream=False)),
     {16384: "engine: h2_protocol_error", 100: "engine: h2_protocol_error"}, 16_384),
    ("malformed HEADERS (server resets)", "CVE-2019-9514, -9516",
     _headers_then(lambda r, s: r.headers(s, [*request_fields(), (b"X-Up", b"1")])),
     {16384: "budget: h2_premature_resets", 100: "budget: h2_premature_resets"}, 16_384),
    ("CONTINUATION flood", "CVE-2024-27316", _continuation,
     {16384: "engine: h2_continuation_flood", 100: "engine: h2_continuation_flood"}, 16_384),
    ("HPACK bomb: one-byte references", "CVE-2016-6581", _bomb,
     {16384: "engine: h2_header_fields_too_many", 100: "engine: h2_header_fields_too_many"}, 1_000),
    ("header list over policy.max_header_bytes", "CVE-2016-6581", _big_header,
     {16384: "engine: h2_header_list_too_large", 100: "engine: h2_header_list_too_large"}, 70_000),
    ("PING flood", "CVE-2019-9512", lambda: _repeat(F.ping(1)),
     {16384: "budget: h2_control_flood", 100: "budget: h2_control_flood"}, 40_000),
    ("SETTINGS flood", "CVE-2019-9515", lambda: _repeat(F.settings_frame()),
     {16384: "budget: h2_control_flood", 100: "budget: h2_control_flood"}, 16_384),
    ("WINDOW_UPDATE flood", "CVE-2019-9511", lambda: _repeat(F.window_update(0, 1)),
     {16384: "budget: h2_control_flood", 100: "budget: h2_control_flood"}, 16_384),
    ("PRIORITY flood", "CVE-2019-9513", _headers_then(lambda r, s: F.priority(s, 0)),
     {16384: "engine: h2_glitch_flood", 100: "engine: h2_glitch_flood"}, 16_384),
    ("empty DATA flood", "CVE-2019-9518", lambda: _repeat(F.data(1), RawFrames().headers(1, _POST, end_stream=False)),
     {16384: "engine: h2_glitch_flood", 100: "engine: h2_glitch_flood"}, 16_384),
    ("RST_STREAM on closed streams", "CVE-2019-9514", lambda: _repeat(F.rst(1), RawFrames().headers(1)),
     {16384: "engine: h2_rst_flood", 100: "engine: h2_rst_flood"}, 16_384),
    ("zero WINDOW_UPDATE", "RFC 9113 §6.9", lambda: _repeat(F.window_update(0, 0)),
     {16384: "engine: h2_protocol_error", 100: "engine: h2_protocol_error"}, 16_384),
    ("unknown extension frames", "RFC 9113 §5.5", lambda: _repeat(F.unknown(payload=b"")),
     {16384: "engine: h2_glitch_flood", 100: "engine: h2_glitch_flood"}, 16_384),
    ("DATA of 1 byte + 255 of padding", "(traffic)",
     lambda: _repeat(F.data(1, b"x", pad=255), RawFrames().headers(1, _POST, end_stream=False)),
     {16384: "budget: h2_traffic_flood", 100: "budget: h2_traffic_flood"}, 9 << 20),
]
# fmt: on
READ_SIZES = (16384, 100)


def families(read_size: int = 16384) -> list[tuple[str, str, str, int, int, float]]:
    """(family, CVEs, answer, bytes read by then, frames sent by then, server CPU ms) per family."""
    rows = []
    for name, cves, make, _expected, _bound in FAMILIES:
        answer, read, sent, cpu = drive(make(), read_size=read_size)
        rows.append((name, cves, answer, read, sent, cpu * 1e3))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--engines", default="", help=f"comma-separated, of {','.join(ENGINES)} (default: all)")
    a = ap.parse_args()
    print(f"### CPU-µs per request, server side ({a.requests} requests, median of {a.repeat})\n")
    print("| engine | 1 stream at a time | 10 concurrent streams |\n|---|---|---|")
    for name, cells in measure(a.requests, a.repeat, only=[e for e in a.engines.split(",") if e]):
        print(f"| {name} | {cells[1]:.1f} | {cells[10]:.1f} |")
    print("\n### Behaviour\n\n| input | python-hyper h2 | ngh2 |\n|---|---|---|")
    for claim, a_h2, a_ngh2 in claims():
        print(f"| {claim} | {a_h2} | {a_ngh2} |")
    for size in READ_SIZES:
        print(f"\n### Attack families against the adapter + budgets, reads of {size:,} B\n")
        print("| family | CVE | answered by | bytes read | frames sent | server CPU ms |\n|---|---|---|---|---|---|")
        for name, cves, answer, read, sent, cpu in families(size):
            print(f"| {name} | {cves} | {answer} | {read:,} | {sent:,} | {cpu:.1f} |")


if __name__ == "__main__":
    main()
