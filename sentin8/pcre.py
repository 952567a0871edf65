"""Which PCRE2 the WAF engine matches with: the system's JIT-capable ``libpcre2-8`` when there is one.

The ``libmodsecurity`` wheel links PCRE2 statically and built it without JIT, so every CRS regex runs in the
interpreter (measured: a 16 KiB form body takes twice as long to inspect as with JIT, bench/waf_pcre.py). The
engine calls PCRE2 through its PLT (the copy it carries is exported, not bound symbolically), and the dynamic
linker resolves those calls in the global scope first: a ``libpcre2-8.so.0`` loaded ``RTLD_GLOBAL`` *before*
the engine library is opened takes every ``pcre2_*`` call the engine makes (compile, JIT compile, match and
free alike, so no pattern is ever compiled by one copy and matched by the other). ModSecurity already asks
for ``pcre2_jit_compile`` per pattern; with the wheel's copy that call fails and it falls back to the
interpreter, with the system's it succeeds.

``preload`` must run before the engine library is loaded and is idempotent; it never fails: without a usable
system library (not installed, no JIT on this CPU/build) the engine keeps its bundled copy, and the log says
which one is in use either way. Debian: package ``libpcre2-8-0``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
from dataclasses import dataclass

log = logging.getLogger(__name__)

_PCRE2_CONFIG_JIT = 1
_PCRE2_CONFIG_VERSION = 11


@dataclass(frozen=True)
class PcreInUse:
    """What ``preload`` found: ``source`` is ``"system"`` or ``"bundled"``."""

    source: str
    path: str = ""
    version: str = ""
    jit: bool = False
    reason: str = ""  # why the bundled copy stays (empty for the system one)

    def describe(self) -> str:
        if self.source == "system":
            return f"system libpcre2-8 {self.version} ({self.path}), JIT on"
        return f"the wheel's bundled PCRE2 (no JIT): {self.reason}"


_lock = threading.Lock()
_found: PcreInUse | None = None


def _system_library(name: str | None) -> PcreInUse:
    path = name or ctypes.util.find_library("pcre2-8")
    if not path:
        return PcreInUse("bundled", reason="no system libpcre2-8 found (Debian: libpcre2-8-0)")
    try:
        lib = ctypes.CDLL(path)  # local first: only a JIT-capable copy may take the engine's calls
    except OSError as exc:
        return PcreInUse("bundled", reason=f"{path} does not load ({exc})")
    try:
        config = lib.pcre2_config_8
    except AttributeError:
        return PcreInUse("bundled", reason=f"{path} has no pcre2_config_8")
    config.argtypes = [ctypes.c_uint32, ctypes.c_void_p]
    config.restype = ctypes.c_int
    jit = ctypes.c_uint32(0)
    version = ctypes.create_string_buffer(64)
    if config(_PCRE2_CONFIG_JIT, ctypes.byref(jit)) < 0 or not jit.value:
        return PcreInUse("bundled", path=path, reason=f"{path} was built without JIT")
    config(_PCRE2_CONFIG_VERSION, version)
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)  # the same object, now in the global scope
    except OSError as exc:
        return PcreInUse("bundled", path=path, reason=f"{path} does not load globally ({exc})")
    return PcreInUse("system", path=path, version=version.value.decode("ascii", "replace"), jit=True)


def preload(name: str | None = None, *, system: bool = True) -> PcreInUse:
    """Load the system's JIT-capable PCRE2 into the global scope (once); say, in a log line, which PCRE2 the
    WAF engine will use. ``name``: a library path or soname instead of ``find_library``'s answer (tests);
    ``system=False``: keep the bundled copy (the bench's "before"). The first call decides for the process."""
    global _found
    with _lock:
        if _found is None:
            _found = _system_library(name) if system else PcreInUse("bundled", reason="asked for")
            if _found.source == "system":
                log.info("WAF: PCRE2 in use: %s", _found.describe())
            else:
                log.warning("WAF: PCRE2 in use: %s", _found.describe())
        return _found


def in_use() -> PcreInUse | None:
    """What ``preload`` decided, or None before the engine was first loaded."""
    return _found
