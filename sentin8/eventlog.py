"""Lifecycle events as one JSON object per line on stderr.

Operators feed these lines to a log pipeline, so every line parses on its own and carries the same frame:
``ts`` (Unix seconds), ``level``, ``event`` (a stable snake_case name), ``pid`` and ``role`` (supervisor,
resolver, worker, mgmt). Fields describe the event (counts, names, reasons), never a payload byte, header
value, path or query: nothing a client sent is written here.

``install()`` also routes the stdlib ``logging`` records of the libraries we use (and our own modules that
log through ``logging``) into the same shape, so stderr holds one format.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

_role = "supervisor"


def set_role(role: str) -> None:
    """Called once by each process after fork: every later line says which role wrote it."""
    global _role
    _role = role


def event(name: str, level: str = "info", /, **fields: Any) -> None:
    """Write one event line. ``fields`` must be JSON-serialisable (``str()`` is used for the rest)."""
    line = {"ts": round(time.time(), 3), "level": level, "event": name, "pid": os.getpid(), "role": _role}
    line.update(fields)
    try:
        sys.stderr.write(json.dumps(line, default=str, separators=(",", ":")) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed or gone: an event is never worth a crash
        pass


class _JsonHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        fields: dict[str, Any] = {"logger": record.name, "message": record.getMessage()}
        if record.exc_info and record.exc_info[1] is not None:
            fields["error"] = repr(record.exc_info[1])
        event(getattr(record, "event", "log"), record.levelname.lower(), **fields)


def install(level: int = logging.INFO) -> None:
    """Make stdlib logging write through ``event``; idempotent."""
    root = logging.getLogger()
    if not any(isinstance(h, _JsonHandler) for h in root.handlers):
        root.addHandler(_JsonHandler())
    root.setLevel(level)
