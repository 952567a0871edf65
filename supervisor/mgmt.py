"""The management process (``sentin8-proxy: mgmt``): uvicorn serving ``sentin8.mgmt.app`` on the listening
socket the supervisor bound once at start.

The socket outlives this process: while a crashed or SIGKILLed mgmt process is respawned, connections wait in
the kernel's accept queue instead of being refused, and no port race can steal the address. Used ``jti`` values
live in shared memory too, so a replay stays refused across a respawn. The process reads
shared memory only and runs at a lower CPU priority than the workers: a busy dashboard never slows traffic.
"""

from __future__ import annotations

import os
import signal
import socket

import uvicorn
import uvloop

from sentin8.config import Config
from sentin8.mgmt.app import MgmtApp
from sentin8.mgmt.auth import Verifier
from sentin8.mgmt.policy_admin import PolicyAdmin
from sentin8.shm.state import SharedState

NICE = 5  # below the workers (0): the kernel prefers traffic when the CPUs are busy
GRACEFUL_S = 2.0


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
        verifier = Verifier(self.secret, self.cfg.mgmt, jtis=self.shared.jti_tracker())
        app = MgmtApp(self.cfg, self.shared, verifier, policy).starlette()
        config = uvicorn.Config(
            app,
            http="httptools",
            lifespan="off",
            access_log=False,
            log_level="warning",
            server_header=False,
            timeout_graceful_shutdown=GRACEFUL_S,
            limit_concurrency=256,  # past this, 503 at once rather than an unbounded queue
        )
        server = uvicorn.Server(config)
        uvloop.run(server.serve(sockets=[self.sock]))
        return 0
