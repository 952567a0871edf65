"""Child -> supervisor status messages over one inherited pipe (writes of 8 bytes are atomic)."""

from __future__ import annotations

import os
import struct

WORKER_LISTENING = 1  # every listener of this worker is bound and accepting
SNAPSHOT_PUBLISHED = 2  # the resolver published its first routing table
MGMT_LISTENING = 3

_MSG = struct.Struct("<II")
MESSAGE_BYTES = _MSG.size


def send(fd: int, code: int) -> None:
    try:
        os.write(fd, _MSG.pack(os.getpid(), code))
    except OSError:
        pass  # the supervisor is gone; the child finds out through its own signals


def parse(data: bytes) -> list[tuple[int, int]]:
    """Whole messages in ``data`` as (pid, code); the caller keeps any tail for the next read."""
    n = len(data) - len(data) % MESSAGE_BYTES
    return [_MSG.unpack_from(data, i) for i in range(0, n, MESSAGE_BYTES)]
