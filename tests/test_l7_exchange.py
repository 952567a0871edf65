"""The exchange's lifecycle (workers/l7/state.py) driven without sockets: a client side that implements the
``Downstream`` protocol (workers/l7/downstream.py) and records what the exchange asks of it, as HTTP/1.1 bytes
through the sans-IO client writer (``sentin8/http/h1_response.py``), and an upstream connection on a recording
transport."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator

import pytest

import sentin8
from sentin8 import routing
from sentin8.config import Config
from sentin8.http.framing import HeaderBudget, validate_request
from sentin8.http.h1_response import H1Response
from sentin8.http.headers import Header
from sentin8.http.response import UpstreamBody
from sentin8.routing import Instance, Route
from workers.l7 import ConnectionFacts, Downstream, Exchange, ExchangeState, L7Context
from workers.l7.request import Request
from workers.l7.state import DONE, LEGAL, TRANSITIONS, ExchangeStateError, allowed
from workers.upstream import UpstreamConn, UpstreamPool

S = ExchangeState


def test_every_state_but_done_can_end_and_done_is_final():
    for state in S:
        if state is S.DONE:
            assert TRANSITIONS[state] == frozenset()
        else:
            assert S.DONE in TRANSITIONS[state], state.name


def test_bit_masks_are_the_table():
    for a in S:
        for b in S:
            assert allowed(a, b) == (b in TRANSITIONS[a]), (a.name, b.name)
    assert len(LEGAL) == len(S)


def test_only_a_replay_goes_back():
    order = list(S)
    backwards = {(a, b) for a in S for b in TRANSITIONS[a] if order.index(b) < order.index(a)}
    assert backwards == {(S.SENDING, S.CONNECTING), (S.AWAITING, S.CONNECTING)}


class Transport:
    """Records writes (the upstream side)."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def writelines(self, parts) -> None:
        self.written.append(b"".join(parts))

    def is_closing(self) -> bool:
        return self.aborted

    def get_extra_info(self, name: str, default=None):
        return default  # no socket: nothing for the pool to peek at

    def abort(self) -> None:
        self.aborted = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Ctx(L7Context):
    def __init__(self, cfg: Config, table: routing.RoutingTable, pool: UpstreamPool) -> None:
        self.cfg = cfg
        self.table = table
        self.pool = pool
        self.counters: collections.Counter[str] = collections.Counter()
        self.done: list[int] = []
        self.results: list[tuple[str, bool]] = []

    def resolve(self, host: str) -> Route | None:
        return self.table.resolve(host)

    def candidates(self, service: str) -> list[Instance]:
        return list(self.table.instances(service))

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] += n

    def refused(self, refusal) -> None:
        for name in refusal.names:
            self.counters[name] += 1

    def upstream(self, sidx: int, name: str) -> None:
        self.counters[name] += 1

    def request_done(self, ex: Exchange, seconds: float) -> None:
        self.done.append(ex.status)

    def upstream_result(self, instance_id: str, ok: bool) -> None:
        self.results.append((instance_id, ok))

    def policy(self, request):
        return None

    def waf_gate(self):
        return None

    def overloaded(self) -> bool:
        return False

    def backend_failed(self, instance: Instance) -> None:
        self.counters["backend_failed"] += 1

    def service_id(self, service: str) -> int:
        return 0

    def inflight(self, delta: int) -> None:
        pass

    def upstream_tls(self, instance: Instance) -> object | None:
        return None


FACTS = ConnectionFacts(
    client_ip="203.0.113.9",
    scheme="https",
    sni="shop.example.com",
    tls=True,
    tls_version="TLSv1.3",
    client_cert=None,
    external=True,
    acme_only=False,
    refuse_status=0,
    protocol="h1",
)



def test_connection_facts_are_what_was_given_and_read_only_once_compiled() -> None:
    assert (FACTS.client_ip, FACTS.scheme, FACTS.sni, FACTS.tls, FACTS.tls_version) == (
        "203.0.113.9", "https", "shop.example.com", True, "TLSv1.3",
    )
    assert (FACTS.client_cert, FACTS.external, FACTS.acme_only, FACTS.refuse_status, FACTS.protocol) == (
        None, True, False, 0, "h1",
    )
    assert "sni='shop.example.com'" in repr(FACTS)
    if sentin8.BUILD == "compiled":  # a C struct whose fields nothing can write after __init__
        with pytest.raises(AttributeError):
            FACTS.sni = "other.example.com"  # type: ignore[misc]
        assert FACTS.sni == "shop.example.com"

class Client(Downstream):
    """A client side of one request: every event the exchange sends, as the HTTP/1.1 bytes it would write."""

    track_buffers = False

    def __init__(self, ctx: Ctx, loop: asyncio.AbstractEventLoop, req: Request) -> None:
        self.ctx: L7Context = ctx
        self.facts = FACTS  # an instance field, as the base declares it (compiled, a C member the exchange reads)
        self.recorded = ctx  # what the exchange counted and reported
        self.loop = loop
        self.req = req
        self.resp = H1Response(req.head, head_only=req.head is not None and req.head.method == b"HEAD")
        self.out: list[bytes] = []
        self.ended = 0  # exchange_done calls
        self.flushes = 0
        self.paused = False
        self.taken = 0

    @property
    def draining(self) -> bool:
        return False

    @property
    def writing_paused(self) -> bool:
        return False

    @property
    def closes(self) -> bool:
        """Whether an HTTP/1.1 connection would close after this response."""
        return self.resp.close

    def send_interim(self, status: int, reason: bytes, headers: list[Header]) -> None:
        data = self.resp.interim(status, reason, headers)
        if data is not None:
            self.out.append(data)

    def send_head(self, status: int, reason: bytes, headers: list[Header], body: UpstreamBody) -> None:
        self.out.append(self.resp.head(status, reason, headers, body, draining=False))

    def send_body(self, data: bytes) -> None:
        self.out += self.resp.body(data, 16384)

    def send_end(self) -> None:
        data = self.resp.end()
        if data is not None:
            self.out.append(data)

    def send_trailers(self, headers) -> None:
        self.send_end()

    def send_abort(self) -> None:
        self.resp.abort()

    def flush(self) -> None:
        self.flushes += 1

    def send_continue(self) -> None:
        self.out.append(self.resp.continue_())

    def answer_error(self, status: int) -> None:
        self.out.append(self.resp.error(status))

    def answer_local(self, status: int, headers: list[Header], *, keep_alive: bool, body: bytes | None) -> bool:
        self.out.append(self.resp.local(status, headers, keep=keep_alive, body=body))
        return keep_alive

    def hold_body(self, req: Request, data: bytes) -> None:
        req.body.append(data)
        req.buffered += len(data)

    def hold_limit(self, limit: int, held: int) -> None:
        pass

    def body_taken(self) -> None:
        self.taken += 1

    def pause_body(self) -> None:
        self.paused = True

    def resume_body(self) -> None:
        self.paused = False

    def open_tunnel(self, ex: Exchange, conn: UpstreamConn, reason: bytes, headers: list[Header], first: bytes) -> None:
        raise AssertionError("no test here upgrades")

    def exchange_done(self, ex: Exchange) -> None:
        self.ended += 1

    def track(self, held: int) -> None:
        pass


def _is_downstream(client: Downstream) -> Downstream:
    return client  # a type checker refuses this if Client stops implementing the protocol


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()  # never run: only call_at/create_future are used
    yield loop
    loop.close()


def exchange(loop: asyncio.AbstractEventLoop, method: bytes = b"GET", body: bool = False, chunked: bool = False):
    inst = Instance(id="web-0", service="web", host="127.0.0.1", port=9)
    table = routing.build([Route(hostname="shop.example.com", service="web")], [inst], built_at=0.0)
    pool = UpstreamPool(loop)
    ctx = Ctx(Config(), table, pool)
    conn = UpstreamConn(pool, inst.id)
    upstream = Transport()
    conn.connection_made(upstream)  # type: ignore[arg-type]
    pool.release(conn)  # parked idle: the exchange takes it warm
    req = Request(HeaderBudget(100, 65536))
    headers = [(b"Host", b"shop.example.com")]
    if chunked:
        headers.append((b"Transfer-Encoding", b"chunked"))
    elif body:
        headers.append((b"Content-Length", b"4"))
    req.head = validate_request(method, b"/", "1.1", headers, keep_alive=True, upgrade=False)
    req.complete = not (body or chunked)
    client = Client(ctx, loop, req)
    ex = Exchange(_is_downstream(client), req)
    return ex, client, upstream


def sent(loop: asyncio.AbstractEventLoop, upstream: Transport) -> bytes:
    """What reached the backend's transport: a connection's queued bytes leave at the end of the loop's turn
    (``UpstreamConn.send``), so the turn is run first."""
    loop.run_until_complete(asyncio.sleep(0))
    return b"".join(upstream.written)


def next_exchange(client: Client, method: bytes = b"GET") -> tuple[Exchange, Client]:
    """Another request to the same service through the same context and pool (a keep-alive client's next)."""
    req = Request(HeaderBudget(100, 65536))
    req.head = validate_request(method, b"/", "1.1", [(b"Host", b"shop.example.com")], keep_alive=True, upgrade=False)
    req.complete = True
    nxt = Client(client.recorded, client.loop, req)
    return Exchange(_is_downstream(nxt), req), nxt


def test_one_parser_carries_a_connections_responses_one_owner_at_a_time(loop):
    ex, client, _ = exchange(loop)
    ex.begin()
    conn = ex.conn
    lent = ex.resp_parser
    ex.upstream_data(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")
    assert ex.state is DONE and conn.response_parser.callbacks.owner is None  # given back at the boundary
    second, client2 = next_exchange(client)
    second.begin()
    assert second.conn is conn and second.resp_parser is lent  # the same connection, the same parser
    second.upstream_data(b"HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\nX-Second: 1\r\n\r\nno!")
    assert second.state is DONE and second.status == 404
    assert (b"X-Second", b"1") in second.resp_headers and all(n != b"X-Second" for n, _ in ex.resp_headers)
    assert b"".join(client2.out).endswith(b"\r\n\r\nno!") and b"".join(client.out).endswith(b"\r\n\r\nhi")
    assert client.recorded.done == [200, 404]
    assert ex.resp_parser is None and second.resp_parser is None  # no exchange keeps it (nor a cycle) after


def test_a_connection_not_reused_takes_its_parser_with_it(loop):
    ex, client, upstream = exchange(loop, b"HEAD")
    ex.begin()
    conn = ex.conn
    ex.upstream_data(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")  # the parser cannot know a HEAD's end
    assert ex.state is DONE and upstream.aborted and conn.closed
    assert client.recorded.pool.acquire(conn.instance_id) is None  # never lent again


def test_a_parser_without_owner_stops_at_the_first_byte():
    import httptools

    from workers.l7.relay import ResponseParser
    from workers.l7.request import Stop

    parser = ResponseParser(100, 65536)
    with pytest.raises(httptools.HttpParserError) as err:
        parser.parser.feed_data(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    assert isinstance(err.value.__context__, Stop)


def test_a_warm_get_goes_awaiting_then_done(loop):
    ex, client, upstream = exchange(loop)
    ex.begin()
    assert ex.state is S.AWAITING
    assert upstream.written == []  # queued until the end of the turn, with every other request of it
    assert sent(loop, upstream).startswith(b"GET / HTTP/1.1\r\n")
    ex.upstream_data(b"HTTP/1.1 200 OK\r\nContent-")
    assert ex.state is S.RESPONSE_HEAD  # bytes came, the head is not complete
    ex.upstream_data(b"Length: 2\r\n\r\nhi")
    assert ex.state is DONE
    assert b"".join(client.out).endswith(b"\r\n\r\nhi")
    assert client.ended == 1 and not client.closes
    assert client.recorded.done == [200]


def test_a_body_still_coming_is_sending_until_its_end(loop):
    ex, _, upstream = exchange(loop, b"POST", body=True)
    ex.begin()
    assert ex.state is S.SENDING
    ex.client_body(b"abcd")
    ex.req.complete = True
    ex.client_body_end()
    assert ex.state is S.AWAITING
    assert sent(loop, upstream).endswith(b"\r\n\r\nabcd")


def test_an_early_response_streams_while_the_body_is_sent(loop):
    ex, _, upstream = exchange(loop, b"POST", body=True)
    ex.begin()
    ex.upstream_data(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n")
    assert ex.state is S.STREAMING
    ex.client_body(b"abcd")  # still forwarded
    assert sent(loop, upstream).endswith(b"\r\n\r\nabcd")


def upstream_requests(data: bytes) -> list[bytes]:
    """The bodies of the requests in ``data`` as a backend parses them; raises on bytes outside a request."""
    import httptools

    class Seen:
        def __init__(self) -> None:
            self.bodies: list[bytes] = []
            self.body = b""

        def on_body(self, body: bytes) -> None:
            self.body += body

        def on_message_complete(self) -> None:
            self.bodies.append(self.body)
            self.body = b""

    seen = Seen()
    httptools.HttpRequestParser(seen).feed_data(data)
    return seen.bodies


@pytest.mark.parametrize("held", [b"", b"ab"], ids=["sent-as-read", "held-then-sent"])
def test_an_empty_body_read_never_ends_a_chunked_body_early(loop, held):
    """An HTTP/2 client's empty DATA frame (h2's ``end_stream`` sends one with END_STREAM) arrives as an empty
    body read. Framed as a chunk it is ``0\r\n\r\n``, the last-chunk: the backend would end the body there
    and take the rest for a request of its own (CI saw the backend fail on a request line "0")."""
    ex, _, upstream = exchange(loop, b"POST", chunked=True)
    if held:  # held before the upstream connection was attached (the WAF's wait, a cold connect)
        ex.req.body += [b"", held, b""]
    ex.begin()
    assert ex.state is S.SENDING
    for data in (b"", b"cd", b"", b"ef", b""):
        ex.client_body(data)
    ex.req.complete = True
    ex.client_body_end()
    assert ex.state is S.AWAITING
    assert upstream_requests(sent(loop, upstream)) == [held + b"cdef"]  # one request, nothing after it


def test_interim_responses_stay_in_response_head(loop):
    ex, client, _ = exchange(loop)
    ex.begin()
    ex.upstream_data(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n")
    assert ex.state is S.RESPONSE_HEAD
    assert client.out[0].startswith(b"HTTP/1.1 103")
    ex.upstream_data(b"HTTP/1.1 204 No Content\r\n\r\n")
    assert ex.state is DONE


def test_head_response_is_received_at_its_head(loop):
    ex, client, _ = exchange(loop, b"HEAD")
    ex.begin()
    ex.upstream_data(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")
    assert ex.state is DONE
    assert client.ended == 1 and not client.closes


def test_response_timeout_only_while_awaiting(loop):
    ex, client, upstream = exchange(loop)
    ex.begin()
    ex.upstream_timeout()
    assert ex.state is DONE
    assert b"504" in client.out[0]
    assert client.ended == 1 and client.closes
    assert upstream.aborted  # never pooled: a late answer must not leak into another request


def test_a_broken_response_after_the_head_truncates(loop):
    ex, client, _ = exchange(loop)
    ex.begin()
    ex.upstream_data(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    assert ex.state is S.STREAMING
    ex.upstream_lost(ex.conn, None)  # the backend closes 7 bytes short
    assert ex.state is DONE
    assert client.recorded.counters["upstream_truncated"] == 1
    assert client.ended == 1 and client.closes


def test_a_local_answer_drops_the_rest_of_the_body(loop):
    ex, client, _ = exchange(loop, b"POST", body=True)
    ex.respond_local(429, [], keep_alive=True)
    assert ex.state is S.ANSWERED
    ex.client_body(b"abcd")
    ex.req.complete = True
    ex.client_body_end()
    assert ex.state is DONE
    assert client.ended == 1 and not client.closes


def test_the_client_leaving_ends_it_once(loop):
    ex, client, upstream = exchange(loop)
    ex.begin()
    ex.client_gone()
    assert ex.state is DONE and upstream.aborted
    ex.upstream_data(b"HTTP/1.1 200 OK\r\n\r\n")  # late events are ignored
    ex.respond_error(502)
    assert client.out == [] and client.ended == 0
    assert client.recorded.counters["client_aborted"] == 1


def test_an_illegal_transition_is_refused(loop):
    ex, _, _ = exchange(loop)
    with pytest.raises(ExchangeStateError):
        ex._to(S.STREAMING)  # from ROUTING: nothing was sent upstream
    assert ex.state is S.ROUTING


def test_both_client_sides_and_this_client_implement_every_member_of_the_base():
    """Downstream's methods raise: each client side must override every one (compiled, the exchange calls the
    per-request ones through the C vtable, so a member left to the base would raise mid-request)."""
    from workers.l7 import L7Bridge
    from workers.l7.h2.stream import H2Stream

    fields = {"ctx", "loop", "facts"}  # set per instance
    members = {n for n in vars(Downstream) if not n.startswith("_")} - fields
    assert members >= {"send_head", "send_body", "send_end", "send_abort", "answer_local", "hold_body", "flush"}
    for cls in (L7Bridge, H2Stream, Client):
        missing = sorted(n for n in members if getattr(cls, n) is getattr(Downstream, n))
        assert missing == [], (cls.__name__, missing)
