from __future__ import annotations

import pytest

from tests.peers import Fleet, TLSBackend


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
        f.stop()

pytest_plugins = ["tests.servers"]
