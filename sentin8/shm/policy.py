"""The runtime policy overlay in shared memory: one writer at a time (the supervisor at boot, then the
management process), every worker a reader.

It is a small instance of the routing snapshot's seqlock double buffer (``sentin8.shm.snapshot``): same
torn-copy guarantees, one rule in one place. A worker checks the generation word per request (one shared
read) and recomputes its effective policy only when the word moved, so a change reaches every worker at its
next request.
"""

from __future__ import annotations

from .. import runtime_policy
from ..config import Policy
from . import snapshot

CAPACITY = 4096  # the overlay is five keys of JSON: ~150 bytes


def region_bytes() -> int:
    return snapshot.region_bytes(CAPACITY)


class PolicyWriter:
    def __init__(self, view: memoryview) -> None:
        self._writer = snapshot.SnapshotWriter(view, CAPACITY)

    def publish(self, overlay: runtime_policy.Overlay) -> int:
        return self._writer.publish(runtime_policy.encode(overlay))


class PolicyReader:
    def __init__(self, view: memoryview) -> None:
        self._reader = snapshot.SnapshotReader(view, CAPACITY)
        self.generation_word = view[:8].cast("Q")  # [0] is the seqlock's generation: the per-request check

    def generation(self) -> int:
        return self.generation_word[0]

    def read(self) -> tuple[int, runtime_policy.Overlay]:
        """(generation, overlay); generation 0 and an empty overlay when nothing was ever published."""
        got = self._reader.read()
        if got is None:
            return 0, runtime_policy.Overlay()
        gen, data, _ = got
        try:
            return gen, runtime_policy.decode(data)
        except (ValueError, runtime_policy.OverlayError):
            return gen, runtime_policy.Overlay()  # only our own writer writes here: unreachable in practice


class PolicyCache:
    """A worker's effective ``[policy]`` (config file + runtime overlay), rebuilt only when the overlay's
    generation moved: the same object otherwise, so a caller can tell a change by identity."""

    def __init__(self, reader: PolicyReader, base: Policy) -> None:
        self._reader = reader
        self._word = reader.generation_word
        self._base = base
        self._gen = 0  # generation 0 = nothing published: the config file's values
        self._value = base
        self.rebuilds = 0

    def current(self) -> Policy:
        if self._word[0] != self._gen:
            gen, overlay = self._reader.read()
            self._value = runtime_policy.effective(self._base, overlay)
            self._gen = gen
            self.rebuilds += 1
        return self._value
