"""Management-API refusals counted by reason in shared memory: they outlive a respawned management process and
any reader (``/stats``, the Prometheus exposition) sees them. One writer: the management process."""

from __future__ import annotations

from ..mgmt.auth import REFUSAL_REASONS

INDEX = {reason: i for i, reason in enumerate(REFUSAL_REASONS)}
_OTHER = INDEX["other"]


def region_bytes() -> int:
    return len(REFUSAL_REASONS) * 8


class RefusalCounters:
    def __init__(self, view: memoryview) -> None:
        self._w = view.cast("Q")

    def inc(self, reason: str) -> None:
        i = INDEX.get(reason, _OTHER)
        self._w[i] = self._w[i] + 1

    def read(self) -> dict[str, int]:
        """Every reason, zeros included (a stable shape for metrics)."""
        return {reason: self._w[i] for reason, i in INDEX.items()}
