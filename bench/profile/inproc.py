"""What the in-process profiles share (``keepalive``, ``l4``): the proxy measured alone in this process while its
client and backend run as exec'd children, and the client's round markers read as CPU-time marks.

Children are exec'd, not forked, so ``valgrind --tool=callgrind --trace-children=no`` on the profile leaves them
native and counts the proxy's instructions only.
"""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def child(module: str, role: str, fd: int, *args: object) -> subprocess.Popen:
    """``python -m module --role role --fd fd args...`` with ``fd`` passed down (its end of a socket)."""
    argv = [sys.executable, "-m", module, "--role", role, "--fd", str(fd), *map(str, args)]
    return subprocess.Popen(argv, pass_fds=[fd], env={**os.environ, "PYTHONPATH": str(ROOT)})


def cpu_marks(loop: asyncio.AbstractEventLoop, control: socket.socket) -> list[tuple[float, float]]:
    """This process's (user, system) CPU times at each of the client's round markers (``s`` start, ``e`` end),
    running ``loop`` until the client says ``q``."""
    marks: list[tuple[float, float]] = []
    done = loop.create_future()

    def on_mark() -> None:
        for b in control.recv(64):
            if b == ord("q"):
                done.set_result(None)
            else:
                r = resource.getrusage(resource.RUSAGE_SELF)
                marks.append((r.ru_utime, r.ru_stime))

    loop.add_reader(control.fileno(), on_mark)
    loop.run_until_complete(done)
    return marks


def per_unit(marks: list[tuple[float, float]], units: int) -> tuple[list[float], list[float]]:
    """CPU-µs per unit of each round (user + system), and the user part alone."""
    spans = [(marks[i], marks[i + 1]) for i in range(0, len(marks), 2)]
    total = [(b[0] + b[1] - a[0] - a[1]) / units * 1e6 for a, b in spans]
    user = [(b[0] - a[0]) / units * 1e6 for a, b in spans]
    return total, user


def report(build: str, what: str, unit: str, marks: list[tuple[float, float]], units: int, rounds: int) -> None:
    """One line: the proxy's CPU per ``unit`` over the rounds (median and best), and its user part."""
    per, user = per_unit(marks, units)
    print(
        f"{build:8} {what}: proxy CPU per {unit} median {statistics.median(per):.1f} µs "
        f"(best {min(per):.1f}), of it user {statistics.median(user):.1f} µs (best {min(user):.1f}); "
        f"{rounds} x {units}",
        flush=True,
    )
