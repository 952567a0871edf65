"""Which build of the per-request hot path runs: the Cython-compiled one (``./dev`` builds it) or the .py files.

``MODULES`` is the list ``cython_build.py`` compiles, in place: each extension sits beside its ``.py`` and
Python's import system prefers it. ``guard`` runs first thing when ``sentin8`` is imported (``__init__.py``),
whatever started the process (``./dev``, systemd, pytest): when extensions are present but were built from
other sources (an edit, or an in-place upgrade, since the last build), or ``SENTIN8_PURE=1`` asks for pure
Python, a finder placed ahead of the usual ones loads every listed module from its ``.py`` file: all of them,
never a mix (a compiled module that ``cimport``s another's ``cdef`` class needs that one compiled too). So an
old extension never shadows new source: a stale build runs pure, and says so once on stderr. Without a build
the guard costs a few ``stat`` calls.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

MODULES = (
    # sans-IO HTTP: framing, header hygiene, responses, bodies, HTTP/2 mapping and budgets
    "sentin8.http.acme",
    "sentin8.http.body",
    "sentin8.http.framing",
    "sentin8.http.h1_response",
    "sentin8.http.h2_blocks",
    "sentin8.http.h2_budget",
    "sentin8.http.h2_codes",
    "sentin8.http.h2_engine",
    "sentin8.http.h2_events",
    "sentin8.http.h2_limits",
    "sentin8.http.h2_request",
    "sentin8.http.head_writer",
    "sentin8.http.headers",
    "sentin8.http.llhttp_private",
    "sentin8.http.response",
    "sentin8.http.websocket",
    # per connection and per request outside HTTP: hello parse, classification, limits, accounting, selection
    "sentin8.clienthello",
    "sentin8.netclass",
    "sentin8.tokenbucket",
    "sentin8.refusals",
    "sentin8.selection",
    "sentin8.backends",
    "sentin8.breaker",
    "sentin8.shm.breakers",
    "sentin8.shm.counters",
    "sentin8.shm.suspects",
    "sentin8.shm.snapshot",
    "sentin8.shm.policy",
    "sentin8.policy",
    "sentin8.routing",
    # the L7 edge: the protocol-neutral core, h1 and h2
    "workers.l7.admission",
    "workers.l7.contract",
    "workers.l7.downstream",
    "workers.l7.exchange",
    "workers.l7.relay",
    "workers.l7.request",
    "workers.l7.state",
    "workers.l7.waf_wait",
    "workers.l7.h1.connection",
    "workers.l7.h1.flow",
    "workers.l7.h1.reader",
    "workers.l7.h1.tunnel",
    "workers.l7.h1.writer",
    "workers.l7.h2.connection",
    "workers.l7.h2.lifecycle",
    "workers.l7.h2.send_deadline",
    "workers.l7.h2.stream",
    # the worker's side of a request: TLS records, the upstream connection, deadlines, the L7 context
    "sentin8.tls",
    "sentin8.tls_connection",
    "sentin8.key_shares",
    "workers.deadline",
    "workers.l7_context",
    "workers.task_timeout",
    "workers.tls_entry",
    "workers.tls_layer",
    "workers.tls_transport",
    "workers.unread",
    "workers.upstream",
    # every new connection: accept to hand-off, the ClientHello peek, the L4 backend connect and pipe
    "sentin8.holds",
    "workers.listener",
    "workers.connect",
    "workers.door",
    "workers.l4_pipe",
    "workers.peek",
    "workers.poll_set",
    "workers.timer_queue",
    # every new TLS connection: its certificate by SNI, the fleet's session tickets; the WAF's on/off per request
    "sentin8.certstore",
    "sentin8.session_tickets",
    "sentin8.ticketkeys",
    "workers.waf_gate",
    # an inspected request's calls into the WAF engine (C calls, not ctypes)
    "sentin8.waf_calls",
)
ROOT = Path(__file__).resolve().parent.parent  # the tree the package runs from (an editable install: the repo)


def loaded_compiled(module_file: str) -> bool:
    """Whether the module whose ``__file__`` this is runs compiled (an extension beside its ``.py``). For a module
    whose ``.pxd`` cimports cython: it cannot ``import cython`` for ``cython.compiled`` (Cython refuses the pure
    fallback's definition of that name beside the cimport)."""
    return not module_file.endswith(".py")


def source(module: str, root: Path = ROOT) -> Path:
    return root / (module.replace(".", "/") + ".py")


def extension(module: str, root: Path = ROOT) -> Path:
    return root / (module.replace(".", "/") + importlib.machinery.EXTENSION_SUFFIXES[0])


def augmenting(module: str, root: Path = ROOT) -> Path:
    """The module's ``.pxd`` (C types for its classes and hot functions), when it has one."""
    return root / (module.replace(".", "/") + ".pxd")


def stamp(root: Path = ROOT) -> Path:
    """``<fingerprint> cython <version>``, written by a successful build."""
    return root / "sentin8" / "native.stamp"


def fingerprint(root: Path = ROOT) -> str:
    """What a build depends on: the listed sources, their ``.pxd`` files and the interpreter's ABI (Cython is
    pinned in pyproject)."""
    h = hashlib.sha256(sys.implementation.cache_tag.encode())
    for module in MODULES:
        h.update(module.encode() + b"\0" + source(module, root).read_bytes() + b"\0")
        pxd = augmenting(module, root)
        if pxd.exists():
            h.update(b"pxd\0" + pxd.read_bytes() + b"\0")
    return h.hexdigest()


def state(root: Path = ROOT) -> str:
    """``"pure"`` (no build), ``"compiled"`` (built from these sources) or ``"stale"`` (from other sources).

    Compiled means every listed module has its extension and the stamp matches: a partial build (an interrupted
    one, a module added to the list since) is stale, never half-loaded."""
    built = [extension(m, root).exists() for m in MODULES]
    if not any(built):
        return "pure"
    if not all(built):
        return "stale"
    try:
        stamped = stamp(root).read_text().split()[:1]
    except OSError:
        return "stale"
    return "compiled" if stamped == [fingerprint(root)] else "stale"


class SourceFirst:
    """A meta-path finder that loads the listed modules from their ``.py`` files, extensions or not."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name not in MODULES:
            return None
        return importlib.util.spec_from_file_location(name, source(name))


def pure_requested() -> bool:
    """``SENTIN8_PURE=1`` in the environment: run the ``.py`` files, compiled build or not (an A/B without
    rebuilding; ``./dev`` also runs the pure half of the suite this way)."""
    return os.environ.get("SENTIN8_PURE", "") not in ("", "0")


def guard() -> str:
    """Make a stale build (or ``SENTIN8_PURE=1``) run pure; the build that will run: "pure" or "compiled"."""
    found = state()
    if found == "pure":
        return "pure"
    if found == "compiled" and not pure_requested():
        return "compiled"
    if not any(isinstance(f, SourceFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, SourceFirst())
    if found == "stale":
        print(
            "sentin8: WARNING: the compiled modules were built from other sources: running PURE PYTHON "
            "(./dev rebuilds them, ./dev pure removes them)",
            file=sys.stderr,
        )
    return "pure"
