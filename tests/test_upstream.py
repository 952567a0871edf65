"""workers.upstream deadlines over real loopback sockets: an idle pooled connection closes after
idle_timeout_s, a request with no answer times out after response_timeout_s, and neither fires while the
connection keeps being used (the one timer handle is re-armed, never leaked)."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest
import uvloop

from sentin8.routing import Instance
from workers.upstream import UpstreamConn, UpstreamPool


class Owner:
    """The exchange side of a connection: records what the connection tells it."""

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.timeouts = 0
        self.lost = 0

    def upstream_data(self, data: bytes) -> None:
        self.data.append(data)

    def upstream_lost(self, conn: UpstreamConn, exc: Exception | None) -> None:
        self.lost += 1

    def upstream_pause_writing(self) -> None:
        pass

    def upstream_resume_writing(self) -> None:
        pass

    def upstream_timeout(self) -> None:
        self.timeouts += 1


@pytest.fixture
def silent_backend():
    """Accepts and reads, answers only b"ping" lines (with b"pong"), never closes first."""
    srv = socket.create_server(("127.0.0.1", 0))
    conns: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            conns.append(c)
            threading.Thread(target=echo, args=(c,), daemon=True).start()

    def echo(c: socket.socket) -> None:
        try:
            while data := c.recv(4096):
                if b"ping" in data:
                    c.sendall(b"pong")
        except OSError:
            pass

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()
    for c in conns:
        c.close()


def run(coro):
    loop = uvloop.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


async def _wait(pred, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.01)


def test_idle_connection_closes_at_idle_timeout_unless_reused(silent_backend):
    async def main() -> None:
        loop = asyncio.get_running_loop()
        pool = UpstreamPool(loop, idle_timeout_s=0.3, response_timeout_s=5.0)
        inst = Instance("b-1", "b", "127.0.0.1", silent_backend)
        conn = await pool.connect(inst)
        t0 = loop.time()
        for _ in range(20):  # reused every 50 ms for a second: never idle for 0.3 s
            pool.release(conn)
            await asyncio.sleep(0.05)
            again = pool.acquire("b-1")
            assert again is conn and not conn.closed
        pool.release(conn)
        await _wait(lambda: conn.closed)
        assert loop.time() - t0 >= 1.0 + 0.3 - 0.05
        assert pool.idle_count() == 0

    run(main())


def test_response_deadline_fires_once_and_only_without_an_answer(silent_backend):
    async def main() -> None:
        loop = asyncio.get_running_loop()
        pool = UpstreamPool(loop, idle_timeout_s=10.0, response_timeout_s=0.3)
        inst = Instance("b-1", "b", "127.0.0.1", silent_backend)
        conn = await pool.connect(inst)
        owner = Owner()
        conn.owner = owner
        for _ in range(10):  # answered requests: the deadline ends with the first byte
            conn.transport.write(b"ping")
            conn.expect_response()
            n = len(owner.data)
            await _wait(lambda n=n: len(owner.data) > n)
        await asyncio.sleep(0.5)
        assert owner.timeouts == 0
        t0 = loop.time()
        conn.transport.write(b"no answer")
        conn.expect_response()
        await _wait(lambda: owner.timeouts == 1)
        assert loop.time() - t0 >= 0.3 - 0.02
        await asyncio.sleep(0.4)
        assert owner.timeouts == 1  # once
        conn.close()
        assert conn.closed

    run(main())


def test_a_closed_connection_fires_nothing(silent_backend):
    async def main() -> None:
        loop = asyncio.get_running_loop()
        pool = UpstreamPool(loop, idle_timeout_s=0.1, response_timeout_s=0.1)
        conn = await pool.connect(Instance("b-1", "b", "127.0.0.1", silent_backend))
        owner = Owner()
        conn.owner = owner
        conn.expect_response()
        conn.close()
        await asyncio.sleep(0.3)
        assert owner.timeouts == 0

    run(main())


def test_a_pooled_connection_the_backend_closed_is_not_handed_out_before_the_loop_sees_the_close():
    """A backend's keep-alive timeout closes an idle pooled connection; its FIN is in the kernel, the loop has
    not polled since (it is busy with the very request about to take a connection). ``acquire`` must not hand
    the dead connection out: a POST sent on it could only be answered 502 (it cannot be replayed)."""
    import select

    srv = socket.create_server(("127.0.0.1", 0))
    accepted: dict[tuple, socket.socket] = {}  # by the proxy side's address

    def accept() -> None:
        for _ in range(2):
            c, addr = srv.accept()
            accepted[addr] = c

    async def main() -> None:
        loop = asyncio.get_running_loop()
        pool = UpstreamPool(loop, idle_timeout_s=10.0, response_timeout_s=5.0)
        inst = Instance("b-1", "b", "127.0.0.1", srv.getsockname()[1])
        t = threading.Thread(target=accept, daemon=True)
        t.start()
        live, stale = await pool.connect(inst), await pool.connect(inst)
        await asyncio.to_thread(t.join, 5)
        pool.release(live)
        pool.release(stale)  # the most recently used: acquire's first pick
        assert pool.idle_count("b-1") == 2
        accepted[stale.transport.get_extra_info("sockname")].close()  # the backend's keep-alive timeout
        # wait for the FIN in the kernel, blocking the loop: it cannot deliver connection_lost meanwhile
        fd = stale.transport.get_extra_info("socket").fileno()
        assert select.select([fd], [], [], 5)[0], "no FIN"
        assert not stale.closed  # the loop has not seen it
        got = pool.acquire("b-1")
        assert got is live and not live.closed  # the dead one was dropped, the live one handed out
        assert stale.closed and pool.idle_count("b-1") == 0
        assert pool.acquire("b-1") is None
        live.close()

    try:
        run(main())
    finally:
        srv.close()
        for c in accepted.values():
            c.close()


def test_connect_to_a_backend_that_never_answers_times_out_and_leaves_the_task_uncancelled():
    """A listener whose accept queue is full drops new SYNs: the connect hangs until connect_timeout_s."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):  # beyond the queue's room: later SYNs go unanswered
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            fillers.append(s)

        async def main() -> None:
            loop = asyncio.get_running_loop()
            pool = UpstreamPool(loop, connect_timeout_s=0.3)
            t0 = loop.time()
            with pytest.raises(TimeoutError):
                await pool.connect(Instance("b-1", "b", "127.0.0.1", port))
            took = loop.time() - t0
            assert 0.3 - 0.02 <= took < 3.0  # uvloop: 1 ms clock steps
            task = asyncio.current_task()
            assert task is not None and task.cancelling() == 0

        run(main())
    finally:
        for s in fillers:
            s.close()
        srv.close()


class RecordingTransport:
    """The connection's transport, its writes recorded (each call one entry) and passed on."""

    def __init__(self, inner: asyncio.Transport) -> None:
        self.inner = inner
        self.calls: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.calls.append(bytes(data))
        self.inner.write(data)

    def writelines(self, parts) -> None:
        parts = list(parts)
        self.calls.append(b"".join(parts))
        self.inner.writelines(parts)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


async def _recorded(pool: UpstreamPool, port: int) -> tuple[UpstreamConn, RecordingTransport]:
    conn = await pool.connect(Instance("b-1", "b", "127.0.0.1", port))
    rec = RecordingTransport(conn.transport)
    conn.transport = rec
    return conn, rec


def test_queued_bytes_leave_at_the_end_of_the_turn_in_order_one_write_per_connection(silent_backend):
    """The requests of one turn reach the backend in one burst: nothing is written while the turn runs."""

    async def main() -> None:
        pool = UpstreamPool(asyncio.get_running_loop())
        a, rec_a = await _recorded(pool, silent_backend)
        b, rec_b = await _recorded(pool, silent_backend)
        a.send(b"GET /a HTTP/1.1\r\n\r\n")
        b.send(b"POST /b HTTP/1.1\r\n")
        b.send_lines([b"Content-Length: 2\r\n\r\n", b"hi"])
        assert rec_a.calls == [] and rec_b.calls == []
        await asyncio.sleep(0)  # the turn ends
        assert rec_a.calls == [b"GET /a HTTP/1.1\r\n\r\n"]
        assert rec_b.calls == [b"POST /b HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi"]
        await asyncio.sleep(0)
        assert len(rec_a.calls) == 1 and len(rec_b.calls) == 1  # written once
        a.close()
        b.close()

    run(main())


def test_a_body_past_the_bound_goes_at_once_so_flow_control_meets_it_while_reading(silent_backend):
    """A body read must reach the transport (and its pause_writing) during the read, not at the turn's end:
    libuv reads a socket up to 32 times per turn, which would otherwise pile up unchecked."""
    from workers.upstream import SEND_SOON_MAX

    async def main() -> None:
        pool = UpstreamPool(asyncio.get_running_loop())
        conn, rec = await _recorded(pool, silent_backend)
        conn.send(b"PUT / HTTP/1.1\r\n\r\n")
        body = b"x" * SEND_SOON_MAX
        conn.send(body)
        assert rec.calls == [b"PUT / HTTP/1.1\r\n\r\n" + body]  # past the bound: now, the head first
        conn.send(b"tail")
        assert len(rec.calls) == 1
        await asyncio.sleep(0)
        assert rec.calls[1:] == [b"tail"]
        conn.close()

    run(main())


def test_bytes_queued_on_a_connection_closed_in_the_same_turn_are_never_written(silent_backend):
    async def main() -> None:
        pool = UpstreamPool(asyncio.get_running_loop())
        conn, rec = await _recorded(pool, silent_backend)
        conn.send(b"GET / HTTP/1.1\r\n\r\n")
        conn.close()  # the exchange gave up (its client left) before the turn ended
        await asyncio.sleep(0)
        assert rec.calls == []

    run(main())
