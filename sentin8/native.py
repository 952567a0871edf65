"""Which build of the hot sans-IO modules runs: the mypyc-compiled one (``./dev compile``) or the .py files.

``MODULES`` is the list ``mypyc_build.py`` compiles, in place: each extension sits beside its ``.py`` and
Python's import system prefers it. ``guard`` runs first thing when ``sentin8`` is imported (``__init__.py``),
whatever started the process (``./dev``, systemd, pytest): when extensions are present but were built from
other sources (an edit, or an in-place upgrade, since the last ``./dev compile``), or ``SENTIN8_MYPYC=0`` asks
for pure Python, a finder placed ahead of the usual ones loads every listed module from its ``.py`` file. So an
old extension never shadows new source: a stale build runs pure, and says so once on stderr. Without a build
the guard costs one ``stat``.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

MODULES = (
    "sentin8.clienthello",
    "sentin8.netclass",
    "sentin8.tokenbucket",
    "sentin8.http.framing",
    "sentin8.http.headers",
    "sentin8.http.response",
)
RUNTIME = "sentin8.native__mypyc"  # mypyc's shared library for the group (mypyc_build.py names it)
ROOT = Path(__file__).resolve().parent.parent  # the tree the package runs from (an editable install: the repo)


def source(module: str, root: Path = ROOT) -> Path:
    return root / (module.replace(".", "/") + ".py")


def extension(module: str, root: Path = ROOT) -> Path:
    return root / (module.replace(".", "/") + importlib.machinery.EXTENSION_SUFFIXES[0])


def stamp(root: Path = ROOT) -> Path:
    """``<fingerprint> mypy <version>``, written by a successful build."""
    return root / "sentin8" / "native.stamp"


def fingerprint(root: Path = ROOT) -> str:
    """What a build depends on: the listed sources and the interpreter's ABI (mypy is pinned in pyproject)."""
    h = hashlib.sha256(sys.implementation.cache_tag.encode())
    for module in MODULES:
        h.update(module.encode() + b"\0" + source(module, root).read_bytes() + b"\0")
    return h.hexdigest()


def state(root: Path = ROOT) -> str:
    """``"pure"`` (no build), ``"compiled"`` (built from these sources) or ``"stale"`` (from other sources)."""
    if not extension(RUNTIME, root).exists():
        # a module's extension without the runtime beside it would fail to import: leftovers count as stale
        return "stale" if any(extension(m, root).exists() for m in MODULES) else "pure"
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


def guard() -> str:
    """Make a stale build (or ``SENTIN8_MYPYC=0``) run pure; the build that will run: "pure" or "compiled"."""
    found = state()
    if found == "pure":
        return "pure"
    if found == "compiled" and os.environ.get("SENTIN8_MYPYC") != "0":
        return "compiled"
    if not any(isinstance(f, SourceFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, SourceFirst())
    if found == "stale":
        print(
            "sentin8: the mypyc-compiled modules were built from other sources: running the pure .py files "
            "(./dev compile rebuilds them, ./dev pure removes them)",
            file=sys.stderr,
        )
    return "pure"
