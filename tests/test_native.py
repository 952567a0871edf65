"""The Cython build: the modules that run are the ones ``sentin8.native`` says, never a stale build.

The suite runs against whichever build is in place: compiled (what ``./dev test`` builds and CI runs), or pure
Python (``SENTIN8_PURE=1``, ``./dev pure``, or no compiler). These tests pin that every listed module is loaded
the one way or every one the other, that a build made from other sources (or ``SENTIN8_PURE=1``) runs the
``.py`` files, and that the compiled modules take the argument types their callers pass. When ``./dev`` says a
build is expected (``SENTIN8_EXPECT_COMPILED=1``), a silent fallback to pure Python fails here.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys

import pytest

import sentin8
from sentin8 import native

COMPILED = sentin8.BUILD == "compiled"
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _loaded_from(name: str) -> str:
    return str(importlib.import_module(name).__file__)


def test_the_hot_modules_are_listed():
    assert "sentin8.clienthello" in native.MODULES
    assert "sentin8.http.framing" in native.MODULES
    for name in native.MODULES:
        assert native.source(name).is_file(), name


@pytest.mark.skipif(os.environ.get("SENTIN8_EXPECT_COMPILED") != "1", reason="no compiled build expected")
def test_the_compiled_build_is_the_one_running_when_one_was_built():
    # ./dev sets SENTIN8_EXPECT_COMPILED=1 after a successful build: the hot path must then really run compiled
    assert COMPILED, f"a build was made but this process runs {sentin8.BUILD} (state {native.state()})"
    for name in ("workers.l7.exchange", "workers.l7.h1.connection", "sentin8.http.framing", "workers.tls_layer"):
        assert _loaded_from(name).endswith(SUFFIX), name


def test_every_listed_module_runs_as_the_guard_decided():
    for name in native.MODULES:
        where = _loaded_from(name)
        if COMPILED:
            assert where.endswith(SUFFIX), f"{name} should run compiled, {where} was loaded"
        else:
            assert where.endswith(".py"), f"{name} should run pure, {where} was loaded"


def test_a_stale_build_is_never_the_one_that_runs():
    assert native.state() != "stale" or not COMPILED


def test_the_finder_loads_the_source_file():
    finder = native.SourceFirst()
    spec = finder.find_spec("sentin8.http.framing")
    assert spec is not None and str(spec.origin).endswith("framing.py")
    assert finder.find_spec("sentin8.config") is None  # not listed: the usual finders decide


def test_state_of_a_tree(tmp_path):
    # a copy of the listed sources with stand-in extension files: state() reads names and the stamp only
    for name in native.MODULES:
        copy = native.source(name, tmp_path)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(native.source(name).read_bytes())
    assert native.state(tmp_path) == "pure"
    for name in native.MODULES:
        native.extension(name, tmp_path).write_bytes(b"")
    assert native.state(tmp_path) == "stale"  # no stamp: not known to be built from these sources
    native.stamp(tmp_path).write_text(f"{native.fingerprint(tmp_path)} cython 3.3.1\n")
    assert native.state(tmp_path) == "compiled"
    edited = native.source("sentin8.netclass", tmp_path)
    edited.write_bytes(edited.read_bytes() + b"# edited after the build\n")
    assert native.state(tmp_path) == "stale"
    native.stamp(tmp_path).write_text(f"{native.fingerprint(tmp_path)} cython 3.3.1\n")
    pxd = native.augmenting("sentin8.netclass", tmp_path)
    pxd.write_text("# C declarations added after the build\n")
    assert native.state(tmp_path) == "stale"  # a .pxd changes the compiled code as much as the .py
    native.stamp(tmp_path).write_text(f"{native.fingerprint(tmp_path)} cython 3.3.1\n")
    native.extension("workers.l7.exchange", tmp_path).unlink()  # a partial build would be a mix
    assert native.state(tmp_path) == "stale"


def _build_in_child(pure: str, first: str = "sentin8") -> str:
    env = {**os.environ, "SENTIN8_PURE": pure}
    # ``first``: importing a compiled package's module before sentin8 itself still settles the build first
    code = f"import {first}; import sentin8, workers.l7.exchange as e; print(sentin8.BUILD, e.__file__)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout


def test_sentin8_pure_runs_pure_even_when_compiled():
    for first in ("sentin8", "workers.l7"):
        build, where = _build_in_child("1", first).split()
        assert build == "pure" and where.endswith("exchange.py"), first


def test_a_pure_install_without_cython_runs_the_cffi_calls():
    # sentin8/tls_connection.py and workers/listener.py ask Cython whether they run compiled; a pure wheel installed
    # without Cython must import them all the same and run RecordIO's per-record calls through cffi, accept
    # through the stdlib
    code = (
        "import sys; sys.modules['cython'] = None\n"  # as if not installed: its import raises ImportError
        "import sentin8\nfrom sentin8 import tls, tls_connection\nfrom workers import listener\n"
        "io = tls_connection.RecordIO.accepting(tls.client_context())\n"
        "door = listener.bind_reuseport('127.0.0.1:0', 'listen.test')\n"
        "print(sentin8.BUILD, tls_connection.cython.compiled, io.read(), io.drain() == b'', tls_connection.__file__,\n"
        "      listener.cython.compiled, door.accept(), listener.__file__)"
    )
    env = {**os.environ, "SENTIN8_PURE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    build, compiled, read, drained, where, accept_compiled, accepted, accept_where = out.split()
    assert (build, compiled, read, drained) == ("pure", "False", "None", "True") and where.endswith("tls_connection.py")
    assert (accept_compiled, accepted) == ("False", "None") and accept_where.endswith("listener.py")


@pytest.mark.skipif(not COMPILED, reason="pure Python build (./dev builds the compiled one)")
def test_a_compiled_build_runs_compiled_in_a_fresh_process():
    build, where = _build_in_child("").split()
    assert build == "compiled" and where.endswith(SUFFIX)


@pytest.mark.skipif(not COMPILED, reason="pure Python build (./dev builds the compiled one)")
def test_compiled_modules_take_what_their_callers_pass():
    # a typed .pxd checks argument types at run time where Python would not: the callers hand bytes from
    # sockets and httptools, str addresses, int token counts
    from sentin8 import clienthello, netclass, tokenbucket
    from sentin8.http import framing, headers, response

    assert isinstance(clienthello.parse(b"\x16\x03\x01\x00"), clienthello.Incomplete)
    assert netclass.Classifier(["10.0.0.0/8"]).is_internal("10.1.2.3")
    assert netclass.Classifier(["198.18.7.0/24"]).contains("::ffff:198.18.7.9")  # listen.proxy_protocol_from
    assert tokenbucket.take(2 * tokenbucket.UNIT) == (True, tokenbucket.UNIT)
    assert framing.split_host(b"Example.COM.:8443") == "example.com"
    assert headers.response_headers([(b"Connection", b"close"), (b"A", b"b")]) == [(b"A", b"b")]
    assert response.encode_chunks(b"abc", 100) == [b"3\r\nabc\r\n"]
    # a big-int token count stays exact (an untyped int is Python's arbitrary-precision int): as the .py says
    pure = _pure_copy("sentin8.tokenbucket")
    assert tokenbucket.refill(0, 0, 2**62, 1e6, 2**40) == pure.refill(0, 0, 2**62, 1e6, 2**40)
    assert tokenbucket.capacity(2**40) == pure.capacity(2**40)


def _pure_copy(name: str):
    """The listed module loaded from its .py under another name, beside the compiled one."""
    spec = importlib.util.spec_from_file_location(f"pure_{name.replace('.', '_')}", native.source(name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
