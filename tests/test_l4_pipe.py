"""workers.l4_pipe over the worker's PollSet, on real loopback TCP sockets: bytes arrive whole through a full
destination (backpressure), a reset ends the pipe, and a finished pipe leaves nothing watched."""

from __future__ import annotations

import asyncio
import gc
import os
import socket

import pytest
import uvloop

from workers.connect import connect_tcp
from workers.l4_pipe import PipePool, SplicePipe
from workers.poll_set import PollSet

PAYLOAD = os.urandom(16 << 20)  # far above two socket buffers and a kernel pipe: the destination fills


def _pair(listener: socket.socket) -> tuple[socket.socket, socket.socket]:
    a = socket.create_connection(listener.getsockname())
    b, _ = listener.accept()
    a.setblocking(False)
    b.setblocking(False)
    return a, b


async def _until(cond, what: str, timeout: float = 10.0) -> None:
    end = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < end, what
        await asyncio.sleep(0.001)


@pytest.fixture
def listener():
    srv = socket.create_server(("127.0.0.1", 0))
    yield srv
    srv.close()


def _run(main) -> None:
    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(main(loop))
    finally:
        loop.close()


async def _backpressured(loop: asyncio.AbstractEventLoop, listener: socket.socket):
    """A pipe between two loopback connections, the client sending PAYLOAD until the backend side is full."""
    poll, pool = PollSet(loop), PipePool()
    client_app, client_side = _pair(listener)
    backend_side, backend_app = _pair(listener)
    closed = loop.create_future()
    pipe = SplicePipe(poll, client_side, backend_side, pool, closed.set_result)
    pipe.start()
    sending = asyncio.ensure_future(loop.sock_sendall(client_app, PAYLOAD))
    await _until(lambda: pipe.upstream.writing, "the backend never filled up")
    return poll, pool, pipe, closed, client_app, backend_app, sending


def test_a_full_destination_backpressures_and_every_byte_arrives(listener):
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        poll, pool, pipe, closed, client_app, backend_app, sending = await _backpressured(loop, listener)
        assert not pipe.upstream.reading  # the client is not read while the backend cannot take more
        got = bytearray()
        while len(got) < len(PAYLOAD):
            chunk = await loop.sock_recv(backend_app, 1 << 20)
            assert chunk, "the pipe ended early"
            got += chunk
        await sending
        assert bytes(got) == PAYLOAD
        assert pipe.upstream.bytes == len(PAYLOAD)
        await loop.sock_sendall(backend_app, b"bye")
        assert await loop.sock_recv(client_app, 3) == b"bye"
        client_app.shutdown(socket.SHUT_WR)
        assert await loop.sock_recv(backend_app, 1) == b""  # the client's EOF passed on
        backend_app.close()
        assert await asyncio.wait_for(closed, 5) is pipe
        assert await loop.sock_recv(client_app, 1) == b""
        assert len(poll) == 0  # nothing left watched, nothing to wake the loop
        client_app.close()
        poll.close()
        pool.close()

    _run(main)


def test_a_reset_while_backpressured_ends_the_pipe(listener):
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        poll, pool, pipe, closed, client_app, backend_app, sending = await _backpressured(loop, listener)
        backend_app.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        backend_app.close()  # RST, with the pipe waiting for it to become writable
        assert await asyncio.wait_for(closed, 5) is pipe
        assert len(poll) == 0
        with pytest.raises(OSError):  # the pipe reset the client too: it learns at once
            await asyncio.wait_for(sending, 5)
        client_app.close()
        poll.close()
        pool.close()

    _run(main)


def test_a_connected_backend_is_handed_to_the_pipe_in_the_set(listener):
    """connect leaves its socket in the set, disarmed; the pipe re-arms it, and a failed connect leaves
    nothing behind."""

    async def main(loop: asyncio.AbstractEventLoop) -> None:
        poll, pool = PollSet(loop), PipePool()
        backend_side = await connect_tcp(poll, "127.0.0.1", listener.getsockname()[1], 2.0)
        backend_app, _ = listener.accept()
        backend_app.setblocking(False)
        assert len(poll) in (0, 1)  # in the set unless the connect completed at once
        client_app, client_side = _pair(listener)
        closed = loop.create_future()
        SplicePipe(poll, client_side, backend_side, pool, closed.set_result).start()
        await loop.sock_sendall(client_app, b"hello")
        assert await loop.sock_recv(backend_app, 5) == b"hello"
        client_app.close()
        backend_app.close()
        await asyncio.wait_for(closed, 5)
        refused = socket.create_server(("127.0.0.1", 0))
        port = refused.getsockname()[1]
        refused.close()
        with pytest.raises(OSError):
            await connect_tcp(poll, "127.0.0.1", port, 2.0)
        assert len(poll) == 0
        poll.close()
        pool.close()

    _run(main)


def test_a_bug_in_one_pipe_costs_that_connection_only(listener):
    """An exception in a pipe's event handler (a bug) aborts that pipe and leaves nothing of it watched
    (level-triggered readiness would call the broken handler forever); the worker's other pipes go on."""

    class BrokenPool(PipePool):  # the bug: the bad pipe's first readable event raises in its direction
        def get(self) -> tuple[int, int]:
            raise RuntimeError("a bug")

    async def main(loop: asyncio.AbstractEventLoop) -> None:
        poll, pool = PollSet(loop), PipePool()
        pipes = []
        for each_pool in (BrokenPool(), pool):
            client_app, client_side = _pair(listener)
            backend_side, backend_app = _pair(listener)
            closed = loop.create_future()
            SplicePipe(poll, client_side, backend_side, each_pool, closed.set_result).start()
            pipes.append((client_app, client_side.fileno(), backend_app, closed))
        (bad_app, _, bad_backend, bad_closed), (client_app, _, backend_app, closed) = pipes
        await loop.sock_sendall(bad_app, b"boom")
        await asyncio.wait_for(bad_closed, 5)  # aborted: both its sockets closed, on_close called once
        assert len(poll) == 2  # only the healthy pipe's two sockets are still watched
        with pytest.raises(OSError):  # reset, so the client learns at once
            while await loop.sock_recv(bad_app, 1):
                pass
        await loop.sock_sendall(client_app, b"fine")  # the other pipe goes on
        assert await loop.sock_recv(backend_app, 4) == b"fine"
        client_app.close()
        backend_app.close()
        await asyncio.wait_for(closed, 5)
        assert len(poll) == 0
        for s in (bad_app, bad_backend):
            s.close()
        poll.close()
        pool.close()

    _run(main)


def test_a_finished_pipe_leaves_the_set_with_its_close_and_its_numbers_serve_new_pipes(listener):
    """The end of a pipe makes no DEL for the sockets it closes (their close takes them out of the kernel's
    set): the same numbers, reused at once, are watched afresh and carry bytes both ways."""

    async def one_pipe(loop, poll: PollSet, pool: PipePool) -> tuple[int, int]:
        client_app, client_side = _pair(listener)
        backend_side, backend_app = _pair(listener)
        fds = (client_side.fileno(), backend_side.fileno())
        closed = loop.create_future()
        SplicePipe(poll, client_side, backend_side, pool, closed.set_result).start()
        await loop.sock_sendall(client_app, b"hello")
        assert await loop.sock_recv(backend_app, 5) == b"hello"
        await loop.sock_sendall(backend_app, b"world")
        assert await loop.sock_recv(client_app, 5) == b"world"
        client_app.shutdown(socket.SHUT_WR)  # the EOF passed on: the backend reads its end
        assert await loop.sock_recv(backend_app, 5) == b""
        backend_app.close()
        await asyncio.wait_for(closed, 5)
        assert len(poll) == 0
        client_app.close()
        return fds

    async def main(loop: asyncio.AbstractEventLoop) -> None:
        poll, pool = PollSet(loop), PipePool()
        first = await one_pipe(loop, poll, pool)
        second = await one_pipe(loop, poll, pool)
        assert set(first) & set(second), "the kernel gave the second pipe other numbers: nothing was reused"
        poll.close()
        pool.close()

    _run(main)


def test_a_closed_pipe_is_freed_by_refcount_not_by_the_collector(listener):
    """Each direction points back at its pipe: once closed, the pipe lets go of them, so a finished L4
    connection's objects go as soon as nothing holds the pipe. With the cycle, every connection would wait for
    the garbage collector (and cost a worker its walk); the collector is off here, so a cycle stays visible."""

    async def main(loop: asyncio.AbstractEventLoop) -> None:
        poll, pool = PollSet(loop), PipePool()
        client_app, client_side = _pair(listener)
        backend_side, backend_app = _pair(listener)
        closed = asyncio.Event()
        carried: list[int] = []

        def on_close(pipe: SplicePipe) -> None:  # as the door's: it keeps what it counts, never the pipe
            carried.append(pipe.upstream.bytes)
            closed.set()

        SplicePipe(poll, client_side, backend_side, pool, on_close).start()
        await loop.sock_sendall(client_app, b"hello")
        assert await loop.sock_recv(backend_app, 5) == b"hello"
        client_app.close()
        backend_app.close()
        await asyncio.wait_for(closed.wait(), 5)
        assert carried == [5] and len(poll) == 0
        assert not [o for o in gc.get_objects() if type(o) is SplicePipe], "a closed pipe outlived its last reference"
        poll.close()
        pool.close()

    gc.collect()  # what earlier tests left
    gc.disable()
    try:
        _run(main)
    finally:
        gc.enable()
