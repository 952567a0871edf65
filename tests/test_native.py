"""The optional mypyc build (mypyc_build.py): the modules that run are the ones the build state says.

The suite runs against whichever build is in place: pure Python by default, the compiled extensions after
``./dev compile`` (README, "Compiled modules"). These tests pin that the listed modules are all loaded the one
way or all the other, never from a build of other sources, and that the compiled ones take the same argument
types the callers pass.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mypyc_build", ROOT / "mypyc_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _build()
COMPILED = build.check() == 0


def _loaded_from(name: str) -> str:
    return str(importlib.import_module(name).__file__)


def test_the_hot_modules_are_listed():
    listed = build.modules()
    assert "sentin8.clienthello" in listed
    assert "sentin8.http.framing" in listed
    for name in listed:
        assert (ROOT / (name.replace(".", "/") + ".py")).is_file(), name


def test_no_build_from_other_sources_is_ever_loaded():
    # ./dev removes or rebuilds a stale build before running anything; a stale extension would shadow the
    # .py files being tested
    assert build.check() != 2, "compiled modules built from other sources: ./dev compile or ./dev pure"


def test_every_listed_module_runs_as_the_build_says():
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for name in build.modules():
        where = _loaded_from(name)
        if COMPILED:
            assert where.endswith(suffix), f"{name} is compiled but {where} was loaded"
        else:
            assert where.endswith(".py"), f"{name} has no current build but {where} was loaded"


@pytest.mark.skipif(not COMPILED, reason="pure Python build (./dev compile to run this compiled)")
def test_compiled_modules_take_what_their_callers_pass():
    # mypyc checks argument types at run time where Python would not: the callers hand bytes from sockets and
    # httptools, str addresses, int token counts
    from sentin8 import clienthello, netclass, tokenbucket
    from sentin8.http import framing, headers, response

    assert isinstance(clienthello.parse(b"\x16\x03\x01\x00"), clienthello.Incomplete)
    assert netclass.Classifier(["10.0.0.0/8"]).is_internal("10.1.2.3")
    assert tokenbucket.take(2 * tokenbucket.UNIT) == (True, tokenbucket.UNIT)
    assert framing.split_host(b"Example.COM.:8443") == "example.com"
    assert headers.response_headers([(b"Connection", b"close"), (b"A", b"b")]) == [(b"A", b"b")]
    assert response.encode_chunks(b"abc", 100) == [b"3\r\nabc\r\n"]
    # a big-int token count stays exact (mypyc's int is arbitrary precision, as Python's)
    assert tokenbucket.refill(0, 0, 2**62, 1e6, 2**40) == tokenbucket.capacity(2**40)
