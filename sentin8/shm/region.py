"""One anonymous shared mapping carved into aligned, named slices."""

from __future__ import annotations

import mmap

CACHE_LINE = 64


def align(n: int, to: int = CACHE_LINE) -> int:
    return (n + to - 1) // to * to


class SharedRegion:
    """Reserve slices first (``reserve``), then ``allocate`` maps them all at once.

    The mapping is anonymous and MAP_SHARED, so it survives ``fork`` and is shared with every child,
    respawned ones included, and disappears with the last process that holds it.
    """

    def __init__(self) -> None:
        self._layout: dict[str, tuple[int, int]] = {}
        self._size = 0
        self.mm: mmap.mmap | None = None

    def reserve(self, name: str, nbytes: int) -> None:
        if self.mm is not None:
            raise RuntimeError("region already allocated")
        self._layout[name] = (self._size, nbytes)
        self._size = align(self._size + nbytes, 4096)

    def allocate(self) -> None:
        self.mm = mmap.mmap(-1, max(self._size, 4096), flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)

    def view(self, name: str) -> memoryview:
        assert self.mm is not None, "allocate() first"
        offset, nbytes = self._layout[name]
        return memoryview(self.mm)[offset : offset + nbytes]

    @property
    def size(self) -> int:
        return self._size
