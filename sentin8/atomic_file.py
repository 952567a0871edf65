"""Replace a file atomically: a temp file in the same directory, fsync, rename. Readers see the old file or
the new one, never a torn one; a crash leaves at most a dot-named temp file, never a half-written target.

One rule for every file the fleet writes in place (certificate pairs, the runtime policy and its cluster
version); the routing cache names its temp file by pid so a successor can clean up after a SIGKILLed writer
(``supervisor/routing_cache.py``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile


def write_atomic(path: str | os.PathLike[str], data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` (permissions ``mode``) so that it appears whole or not at all."""
    path = os.fspath(path)
    directory, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(dir=directory or ".", prefix=f".{name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
