"""Cluster mode's state in shared memory: written by the syncer (in the resolver) only, read by workers (the
share of the limit while Valkey is unreachable) and by the management process (``/health``, ``/metrics``).

One word each, written whole (no torn reads), so there is no lock: a reader may see one field of a sync before
another, never a half-written one. The syncer runs in a process with no counter slot, so its counts live here
rather than in ``counters.NAMES``.
"""

from __future__ import annotations

import time

OFF, FALLBACK, GLOBAL = 0, 1, 2
LIMITER = {OFF: "local", FALLBACK: "local-fallback", GLOBAL: "global"}

(
    _LIMITER,
    _SHARE,  # hosts the limit is divided by while in fallback (0 = the full limit)
    _HOSTS,
    _LAST_OK_US,
    _ROUND_TRIP_US,
    _BATCH,
    _BATCH_MAX,
    _SYNCS,
    _KEYS_SYNCED,
    _KEYS_SKIPPED,
    _ERRORS,
    _FALLBACK_US,  # completed outages
    _FALLBACK_SINCE_US,  # 0 = not in fallback
    _BACKLOG,
    _TICKETS,  # 1 = this fleet seals with the cluster's shared ticket ratchet (the ticket syncer says so)
) = range(15)
WORDS = 16


def region_bytes() -> int:
    return WORDS * 8


def _now_us() -> int:
    return int(time.time() * 1e6)


class ClusterStatus:
    def __init__(self, view: memoryview, clock_us=_now_us) -> None:
        self._w = view.cast("Q")
        self._clock_us = clock_us

    # ---- the syncer (the one writer) ---------------------------------------------------------------------

    def enter_fallback(self, share: int) -> None:
        """Valkey unreachable (or not reached yet): each host limits alone, ``share`` > 1 divides the limit."""
        w = self._w
        w[_SHARE] = share if share > 1 else 0
        if w[_LIMITER] != FALLBACK:
            w[_FALLBACK_SINCE_US] = self._clock_us()
            w[_LIMITER] = FALLBACK

    def enter_global(self) -> None:
        w = self._w
        if w[_LIMITER] == FALLBACK and w[_FALLBACK_SINCE_US]:
            w[_FALLBACK_US] += max(0, self._clock_us() - w[_FALLBACK_SINCE_US])
        w[_FALLBACK_SINCE_US] = 0
        w[_SHARE] = 0
        w[_LIMITER] = GLOBAL

    def hosts(self, n: int) -> None:
        self._w[_HOSTS] = n

    def synced(self, keys: int, batch: int, round_trip_us: int, skipped: int, backlog: int) -> None:
        """One successful sync interval: ``keys`` sent, ``batch`` the largest round trip's keys, ``skipped``
        moved but not worth a round trip, ``backlog`` slots left queued for the next interval."""
        w = self._w
        w[_LAST_OK_US] = self._clock_us()
        w[_ROUND_TRIP_US] = round_trip_us
        w[_BATCH] = batch
        if batch > w[_BATCH_MAX]:
            w[_BATCH_MAX] = batch
        w[_SYNCS] += 1
        w[_KEYS_SYNCED] += keys
        w[_KEYS_SKIPPED] += skipped
        w[_BACKLOG] = backlog

    def failed(self) -> None:
        self._w[_ERRORS] += 1

    def set_tickets_shared(self, shared: bool) -> None:
        """Written by the ticket syncer (the resolver's other cluster task) only."""
        self._w[_TICKETS] = 1 if shared else 0

    # ---- readers -----------------------------------------------------------------------------------------

    @property
    def limiter(self) -> str:
        return LIMITER.get(self._w[_LIMITER], "local")

    @property
    def tickets_shared(self) -> bool:
        return self._w[_TICKETS] == 1

    @property
    def share(self) -> int:
        """Divide the limit by this (1 = the full limit): read by workers on every rate-limited request."""
        return self._w[_SHARE] or 1

    @property
    def hosts_seen(self) -> int:
        return self._w[_HOSTS] or 1

    def fallback_seconds(self) -> float:
        w = self._w
        since = w[_FALLBACK_SINCE_US]
        return (w[_FALLBACK_US] + (max(0, self._clock_us() - since) if since else 0)) / 1e6

    def snapshot(self) -> dict[str, float | int | str | None]:
        """Every field, for ``/metrics`` (``sync_lag_s``: since the last successful sync, None before the first)."""
        w = self._w
        last = w[_LAST_OK_US]
        return {
            "limiter": self.limiter,
            "hosts_seen": self.hosts_seen,
            "sync_lag_s": max(0.0, (self._clock_us() - last) / 1e6) if last else None,
            "round_trip_s": w[_ROUND_TRIP_US] / 1e6,
            "batch_keys": w[_BATCH],
            "batch_keys_max": w[_BATCH_MAX],
            "syncs": w[_SYNCS],
            "keys_synced": w[_KEYS_SYNCED],
            "keys_skipped": w[_KEYS_SKIPPED],
            "sync_errors": w[_ERRORS],
            "fallback_seconds": self.fallback_seconds(),
            "backlog": w[_BACKLOG],
            "ticket_keys_shared": int(w[_TICKETS] == 1),
        }
