"""The listener's accept, which both builds run (compiled: one accept4(SOCK_NONBLOCK) call; pure: the stdlib's):
an empty queue is None, never an exception; every connection is non-blocking from the first byte; the peer is
the tuple the stdlib gives; a failure is the OSError its errno names, and leaves the queue as it was."""

from __future__ import annotations

import errno
import fcntl
import os
import resource
import socket
import time

import pytest

from workers.listener import Listener, bind_reuseport


def _listener(address: str) -> Listener:
    return bind_reuseport(address, "listen.test")


def _queued(listener: Listener, client: socket.socket, deadline_s: float = 5.0) -> tuple[socket.socket, object]:
    """The client's connection, accepted as soon as the kernel has queued it (a poll with a deadline)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        taken = listener.accept()
        if taken is not None:
            return taken
        time.sleep(0.005)
    raise AssertionError(f"no connection from {client.getsockname()} queued within {deadline_s} s")


@pytest.mark.parametrize(
    ("bind", "connect_to", "expected_host"),
    [
        ("127.0.0.1:0", "127.0.0.1", "127.0.0.1"),
        ("[::1]:0", "::1", "::1"),
        ("[::]:0", "127.0.0.1", "::ffff:127.0.0.1"),  # dual stack: a v4 peer as its mapped v6 address
    ],
)
def test_a_connection_comes_non_blocking_with_the_stdlibs_peer_tuple(bind, connect_to, expected_host):
    listener = _listener(bind)
    try:
        assert listener.accept() is None  # nothing queued: a value, not BlockingIOError
        with socket.create_connection((connect_to, listener.getsockname()[1])) as client:
            conn, addr = _queued(listener, client)
            with conn:
                local = client.getsockname()
                assert addr[0] == expected_host
                assert addr[1] == local[1]
                if listener.family == socket.AF_INET6:
                    assert len(addr) == 4 and addr[2:] == (0, 0)  # flowinfo, scope_id, as the stdlib
                else:
                    assert len(addr) == 2
                assert conn.getpeername()[:2] == addr[:2]
                # non-blocking in the kernel and in the socket object, and a plain SOCK_STREAM by its type
                assert fcntl.fcntl(conn.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK
                assert conn.gettimeout() == 0.0
                assert conn.type == socket.SOCK_STREAM
                assert conn.family == listener.family
                assert fcntl.fcntl(conn.fileno(), fcntl.F_GETFD) & fcntl.FD_CLOEXEC
                with pytest.raises(BlockingIOError):
                    conn.recv(1)  # nothing sent yet: a blocking socket would hang here
                client.sendall(b"ping")
                deadline = time.monotonic() + 5
                data = b""
                while not data and time.monotonic() < deadline:
                    try:
                        data = conn.recv(4)
                    except BlockingIOError:
                        time.sleep(0.005)
                assert data == b"ping"
        assert listener.accept() is None  # the one connection was taken once
    finally:
        listener.close()


@pytest.mark.parametrize("source", ["127.0.0.1", "127.9.10.99", "127.100.255.0", "127.255.1.200"])
def test_every_octet_width_of_a_v4_peer_reads_as_the_stdlib_writes_it(source):
    listener = _listener("127.0.0.1:0")
    try:
        with socket.socket() as client:
            client.bind((source, 0))  # all of 127/8 is loopback: one, two and three digit octets, and zeros
            client.connect(listener.getsockname())
            conn, addr = _queued(listener, client)
            conn.close()
            assert addr == client.getsockname() == (source, addr[1])
    finally:
        listener.close()


def test_a_burst_is_taken_in_order_and_then_the_queue_reads_empty():
    listener = _listener("127.0.0.1:0")
    clients = [socket.create_connection(("127.0.0.1", listener.getsockname()[1])) for _ in range(20)]
    try:
        ports = []
        for client in clients:
            conn, addr = _queued(listener, client)
            conn.close()
            ports.append(addr[1])
        assert sorted(ports) == sorted(c.getsockname()[1] for c in clients)
        assert listener.accept() is None
    finally:
        for client in clients:
            client.close()
        listener.close()


def test_out_of_descriptors_is_emfile_and_the_connection_waits_in_the_queue():
    listener = _listener("127.0.0.1:0")
    client = socket.create_connection(("127.0.0.1", listener.getsockname()[1]))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        lowest_free = next(fd for fd in range(soft) if not _is_open(fd))
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # no descriptor number left to give
        try:
            deadline = time.monotonic() + 5
            with pytest.raises(OSError) as failed:  # polled until the kernel has queued it
                while time.monotonic() < deadline:
                    assert listener.accept() is None
                    time.sleep(0.005)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert failed.value.errno == errno.EMFILE
        conn, addr = _queued(listener, client)  # not lost: accepted once a descriptor is free
        conn.close()
        assert addr[1] == client.getsockname()[1]
    finally:
        client.close()
        listener.close()


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)  # opens nothing itself, unlike a listing of /proc/self/fd
    except OSError:
        return False
    return True


def test_a_closed_listener_raises_the_stdlibs_oserror():
    listener = _listener("127.0.0.1:0")
    listener.close()
    with pytest.raises(OSError) as failed:
        listener.accept()
    assert failed.value.errno == errno.EBADF


def test_uvloop_takes_an_accepted_socket_and_closes_its_descriptor_once():
    """uvloop's ``connect_accepted_socket`` reads the socket's family and type (plain ints here, equal to the
    enums), owns the descriptor from then on, and detaches the socket object when the transport closes: the
    descriptor is closed once, by libuv, and the object's own close is then a no-op."""
    import asyncio

    import uvloop

    listener = _listener("127.0.0.1:0")
    try:
        with socket.create_connection(listener.getsockname()) as client:
            conn, _ = _queued(listener, client)
            assert conn.family == socket.AF_INET and type(conn.family) is int
            assert conn.type == socket.SOCK_STREAM and type(conn.type) is int

            async def hand_over() -> bytes:
                loop = asyncio.get_running_loop()
                got: asyncio.Future[bytes] = loop.create_future()

                class Echo(asyncio.Protocol):
                    def data_received(self, data: bytes) -> None:
                        got.set_result(data)

                transport, _ = await loop.connect_accepted_socket(Echo, sock=conn)
                client.sendall(b"ping")
                data = await asyncio.wait_for(got, 5)
                transport.close()  # libuv closes the descriptor here, and uvloop detaches the object
                return data

            fd = conn.fileno()
            assert uvloop.run(hand_over()) == b"ping"
            assert conn.fileno() == -1  # detached: the object no longer names the descriptor
            with pytest.raises(OSError) as closed:
                os.fstat(fd)
            assert closed.value.errno == errno.EBADF
            assert client.recv(1) == b""  # the peer saw the close
    finally:
        listener.close()


def test_adopt_hands_an_accepted_socket_to_uvloop_without_a_task():
    """``tls_entry.adopt`` (the L7 and :80 hand-off) drives ``connect_accepted_socket`` itself: when it returns,
    the transport owns the socket and no Task exists for it; ``connection_made`` comes on the loop's next turn,
    bytes flow, and the awaited future's last step leaves nothing for ``on_failure``."""
    import asyncio

    import uvloop

    from workers.tls_entry import adopt

    listener = _listener("127.0.0.1:0")
    failures: list[BaseException] = []
    try:
        with socket.create_connection(listener.getsockname()) as client:
            conn, _ = _queued(listener, client)

            async def hand_over() -> tuple[int, bytes]:
                loop = asyncio.get_running_loop()
                made: asyncio.Future[asyncio.Transport] = loop.create_future()
                got: asyncio.Future[bytes] = loop.create_future()

                class Echo(asyncio.Protocol):
                    def connection_made(self, transport: asyncio.BaseTransport) -> None:
                        made.set_result(transport)  # type: ignore[arg-type]

                    def data_received(self, data: bytes) -> None:
                        got.set_result(data)

                before = asyncio.all_tasks()
                adopt(loop, Echo, conn, failures.append)
                tasks = len(asyncio.all_tasks() - before)
                assert not made.done()  # the transport owns the socket; connection_made comes on the next turn
                transport = await asyncio.wait_for(made, 5)
                client.sendall(b"ping")
                data = await asyncio.wait_for(got, 5)
                transport.close()
                return tasks, data

            assert uvloop.run(hand_over()) == (0, b"ping")
            assert client.recv(1) == b""  # the transport closed the connection
    finally:
        listener.close()
    assert failures == []


def test_adopt_leaves_a_socket_it_could_not_hand_over_to_the_caller_and_reports_a_failed_last_step():
    """A raise from ``adopt`` means the transport never took the socket (here a datagram socket, which uvloop
    refuses): the caller still owns it, open. What the coroutine's last step raises goes to ``on_failure`` (for
    the connection's hold); its return is no failure."""
    import asyncio

    import uvloop

    from workers.tls_entry import _LastStep, adopt

    failures: list[BaseException] = []

    async def refused() -> None:
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as datagram:
            with pytest.raises(ValueError):
                adopt(loop, asyncio.Protocol, datagram, failures.append)
            assert datagram.fileno() != -1  # still the caller's

    uvloop.run(refused())
    assert failures == []

    async def returns() -> tuple[None, None]:
        return None, None

    async def fails() -> None:
        raise ConnectionResetError

    for steps in (returns(), fails()):
        _LastStep(steps, failures.append).run(None)  # type: ignore[arg-type]
    assert [type(f) for f in failures] == [ConnectionResetError]
