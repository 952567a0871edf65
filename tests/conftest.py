from __future__ import annotations

import pytest

from tests.peers import Fleet, HTTPBackend, TLSBackend


@pytest.fixture
def backend_factory(tmp_path):
    made: list[TLSBackend] = []

    def make(name: str, hostname: str) -> TLSBackend:
        b = TLSBackend(name, hostname, str(tmp_path))
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


@pytest.fixture
def fleet_factory(tmp_path):
    made: list[Fleet] = []

    def make(body: str, workers: int = 2, extra: str = "", **kw) -> Fleet:
        f = Fleet(str(tmp_path), body, workers, extra, **kw)
        made.append(f)
        return f

    yield make
    for f in made:
        # A gauge released more often than acquired is a bug the shm gauge would otherwise hide at zero.
        underflow = f.stats().get("gauge_underflow", 0) if f.proc.poll() is None else 0
        f.stop()
        assert underflow == 0, f"gauge_underflow = {underflow}: a hold or gauge was released twice"


pytest_plugins = ["tests.servers"]


@pytest.fixture
def web():
    """A plain HTTP backend (service "web") for the fleet tests that need one; closed after the test."""
    backend = HTTPBackend("web")
    yield backend
    backend.close()
