"""The management process (``sentin8-proxy: mgmt``): uvicorn serving ``sentin8.mgmt.app`` on the listening
socket the supervisor bound once at start.

The socket outlives this process: while a crashed or SIGKILLed mgmt process is respawned, connections wait in
the kernel's accept queue instead of being refused, and no port race can steal the address. Used ``jti`` values
live in shared memory too, so a replay stays refused across a respawn. The process reads
shared memory only and runs at a lower CPU priority than the workers: a busy dashboard never slows traffic.

A planned stop (a reload restarts this process) loses no request: the process stops accepting first (new
connections queue for its successor), answers whatever arrives on the connections it already holds with
``Connection: close`` for a short grace, and only then closes the ones still idle. uvicorn alone would close an
idle or just-accepted connection at once and reset a request racing that close.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from typing import Any

import uvicorn
import uvloop

from sentin8.config import Config
from sentin8.mgmt.app import MgmtApp
from sentin8.mgmt.policy_admin import PolicyAdmin
from sentin8.shm.state import SharedState

NICE = 5  # below the workers (0): the kernel prefers traffic when the CPUs are busy
GRACEFUL_S = 2.0
IDLE_GRACE_S = 1.0  # how long a stopping process keeps idle connections open for a request racing the stop
IDLE_CHECK_S = 0.02


class _StoppingServer(uvicorn.Server):
    """uvicorn's server with a stop that hands idle connections a last answer instead of a reset."""

    def __init__(self, config: uvicorn.Config, stopping: asyncio.Event) -> None:
        super().__init__(config)
        self.stopping = stopping

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.stopping.set()  # from now on every response carries Connection: close (_CloseWhenStopping)
        for server in self.servers:
            server.close()  # the supervisor's copy of the socket keeps queueing connections for the successor
        # uvicorn exposes no "request arrived" hook to wait on: a short bounded poll, at shutdown only
        deadline = time.monotonic() + IDLE_GRACE_S
        while self._idle_connections() and time.monotonic() < deadline:
            await asyncio.sleep(IDLE_CHECK_S)
        await super().shutdown(sockets)

    def _idle_connections(self) -> int:
        """Open connections with no request in progress: the ones a request could still race."""
        return sum(1 for conn in self.server_state.connections
                   if not conn.transport.is_closing() and (conn.cycle is None or conn.cycle.response_complete))


class _CloseWhenStopping:
    """ASGI wrapper: once the server is stopping, each response says Connection: close, so a keep-alive client
    opens its next request on a fresh connection (served by the successor) instead of racing the close."""

    def __init__(self, app: Any, stopping: asyncio.Event) -> None:
        self.app = app
        self.stopping = stopping

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if not self.stopping.is_set() or scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_closing(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
            await send(message)

        return await self.app(scope, receive, send_closing)


class MgmtProcess:
    def __init__(self, cfg: Config, shared: SharedState, sock: socket.socket, secret: bytes) -> None:
        self.cfg = cfg
        self.shared = shared
        self.sock = sock
        self.secret = secret

    def run(self) -> int:
        signal.signal(signal.SIGQUIT, lambda *_: os._exit(0))  # "stop now" from the supervisor: no core dump
        try:
            os.nice(NICE)
        except OSError:
            pass
        policy = PolicyAdmin(self.cfg.policy, self.cfg.tls.state_dir, self.shared.policy_reader(),
                             self.shared.policy_writer())
        from sentin8.mgmt.auth import Verifier  # PyJWT in this process only (sentin8.mgmt.credentials says why)

        verifier = Verifier(self.secret, self.cfg.mgmt, jtis=self.shared.jti_tracker())
        sync = None
        if self.cfg.cluster.enabled:  # runtime policy across hosts (docs/cluster.md)
            from sentin8.mgmt.policy_sync import PolicySync

            cl = self.cfg.cluster
            sync = PolicySync(policy, self.cfg.cluster_valkey(), cl.cluster_id, self.cfg.cluster_node_id())
        app = MgmtApp(self.cfg, self.shared, verifier, policy, policy_sync=sync).starlette()
        stopping = asyncio.Event()
        config = uvicorn.Config(
            _CloseWhenStopping(app, stopping),
            http="httptools",
            lifespan="off",
            access_log=False,
            log_level="warning",
            server_header=False,
            timeout_graceful_shutdown=GRACEFUL_S,
            limit_concurrency=256,  # past this, 503 at once rather than an unbounded queue
        )
        server = _StoppingServer(config, stopping)
        uvloop.run(self._serve(server, sync))
        return 0

    async def _serve(self, server: uvicorn.Server, sync: Any) -> None:
        task = asyncio.get_running_loop().create_task(sync.run()) if sync is not None else None
        try:
            await server.serve(sockets=[self.sock])
        finally:
            if task is not None:
                task.cancel()
