"""Management-API refusals counted by reason in shared memory: they outlive a respawned management process and
any reader (``/stats``, the Prometheus exposition) sees them. One writer: the management process.

The reasons live here, with the layout they index, not in ``sentin8.mgmt.auth`` (which raises them): importing
shared memory must not import the management package, whose JWT library no worker or resolver needs.
"""

from __future__ import annotations

# Every AuthError reason (sentin8.mgmt.auth), for counting; "other" catches one this list forgot.
REFUSAL_REASONS = (
    "missing",
    "not_bearer",
    "token_in_query",
    "malformed",
    "bad_algorithm",
    "bad_signature",
    "expired",
    "not_yet_valid",
    "bad_audience",
    "bad_issuer",
    "missing_claim",
    "bad_scope_claim",
    "invalid",
    "scope",
    "replay",
    "other",
)
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
