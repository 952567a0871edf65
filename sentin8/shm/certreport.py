"""Which certificates in the store are present but rejected, for ``/health``: one record per worker slot.

Each worker validates the store on its own (lazily, on the handshakes that ask for a name), so each worker
writes only its own slot: one writer per slot, no lock. A slot is a sequence word (odd while being written)
and a length-prefixed msgpack map ``{store dir name: [reason, unix time]}``; a reader retries a slot whose
sequence moved, and merges the slots (the newest verdict per name wins). A name leaves a worker's record
when a usable pair for it loads, so the record lists what is broken now, not what ever was.
"""

from __future__ import annotations

import time

import msgspec

SLOT_BYTES = 8192
_HEADER = 16  # sequence word (8) + payload length (8)
_MAX_NAMES = 16  # per worker; names <= 253 and reasons <= 200 characters: a full map fits its slot
_REASON_MAX = 200


def region_bytes(slots: int) -> int:
    return slots * SLOT_BYTES


class CertReportWriter:
    """A worker's handle on its own slot."""

    def __init__(self, view: memoryview, slot: int) -> None:
        self._view = view[slot * SLOT_BYTES : (slot + 1) * SLOT_BYTES]
        self._words = self._view[:_HEADER].cast("Q")
        self._rejected: dict[str, list[object]] = {}
        self._publish()

    def rejected(self, dirname: str, reason: str, at: float | None = None) -> None:
        self._rejected.pop(dirname, None)
        self._rejected[dirname] = [reason[:_REASON_MAX], time.time() if at is None else at]
        while len(self._rejected) > _MAX_NAMES:
            del self._rejected[next(iter(self._rejected))]  # the oldest verdicts go first
        self._publish()

    def usable(self, dirname: str) -> None:
        if self._rejected.pop(dirname, None) is not None:
            self._publish()

    def _publish(self) -> None:
        payload = msgspec.msgpack.encode(self._rejected)
        seq = self._words[0]
        self._words[0] = seq + 1  # odd: being written
        self._view[_HEADER : _HEADER + len(payload)] = payload
        self._words[1] = len(payload)
        self._words[0] = seq + 2


def read_rejected(view: memoryview, slots: int, attempts: int = 100) -> dict[str, dict[str, object]]:
    """``{store dir name: {"reason": ..., "at": unix time}}`` over every worker slot: the ``/health`` field."""
    merged: dict[str, dict[str, object]] = {}
    for slot in range(slots):
        base = view[slot * SLOT_BYTES : (slot + 1) * SLOT_BYTES]
        words = base[:_HEADER].cast("Q")
        for _ in range(attempts):
            seq = words[0]
            if seq & 1:
                continue
            n = words[1]
            payload = bytes(base[_HEADER : _HEADER + min(n, SLOT_BYTES - _HEADER)])
            if words[0] != seq:
                continue
            entries = msgspec.msgpack.decode(payload) if n else {}
            for name, (reason, at) in entries.items():
                if name not in merged or merged[name]["at"] < at:  # type: ignore[operator]
                    merged[name] = {"reason": reason, "at": at}
            break
    return merged
