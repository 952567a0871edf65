"""The replicated token bucket's arithmetic (sans-IO): one global bucket per key in Valkey, one replica per host
in shared memory, merged every sync interval. Tokens in µ-units (``sentin8.tokenbucket.UNIT``), times in µs.

The merge (run in Valkey by ``limiter_script``; ``merge`` here is its reference and is tested against it)::

    level = max(-D, min(B, level + R·(now - ts)) - Σ admitted)

Between two syncs every host admits from its replica, refilled locally at R, so H hosts can admit up to H times
what the global bucket holds. The floor -D lets that overdraft stand as debt that the next refills repay; floored
at 0 instead, a flood over H hosts would be admitted at H·R forever. With D = (H - 1)·(B + R·(T + L)) (T the
sync interval, L the round trip) the debt covers everything the other hosts can admit between two syncs, so at
any instant the cluster has admitted at most R·t + B + D over any window t, and in the long run R: each sync
takes back exactly what was admitted and the global refill is the only source of tokens.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

from ..tokenbucket import UNIT

MAX_BATCH_KEYS = 512  # keys per Valkey round trip (one script call)
MAX_BATCHES = 2  # round trips per sync interval: at most 1024 keys (~20 ms of CPU) per interval, the rest waits
RECENT_S = 1.0  # a key synced this recently stays synced while it moves (it is contended somewhere)
MATTERS_BELOW = 0.5  # a key whose replica fell below this share of its burst is worth a round trip


def merge(
    level_u: int | None, ts_us: int, now_us: int, rate: float, burst: float, floor_u: int, admitted_u: int
) -> int:
    """The global level after refilling from ``ts_us`` to ``now_us`` and taking ``admitted_u``; ``level_u`` None =
    a key Valkey does not hold (never seen, or expired once full again): a full bucket."""
    full = int(burst * UNIT)
    if level_u is None:
        level = full
    else:
        level = level_u
        if now_us > ts_us:
            level = min(full, level + math.floor((now_us - ts_us) * rate))
    return max(-floor_u, level - admitted_u)


def expiry_ms(level_u: int, rate: float, burst: float) -> int:
    """How long Valkey keeps a key: until it would be full again (then it equals an absent key), plus a second."""
    missing = max(0, int(burst * UNIT) - level_u)
    return math.ceil(missing / rate / 1000) + 1000


def debt_floor_u(hosts: int, rate: float, burst: float, interval_s: float, latency_s: float) -> int:
    """D = (H - 1)·(B + R·(T + L)) in µ-units: what the other hosts can admit between two syncs."""
    return int(max(0, hosts - 1) * (burst + rate * (interval_s + latency_s)) * UNIT)


def write_back(global_u: int, admitted_since: int) -> int:
    """A replica's new level: the global one, less what this host admitted after its counts were read (those
    reach Valkey with the next sync)."""
    return global_u - admitted_since * UNIT


def clamp_sent(unsent: int, rate: float, burst: float, elapsed_s: float) -> int:
    """At most what one host can have admitted since its last successful sync (B + R·elapsed, ``elapsed_s``
    capped at one second): a count grown past that (a stalled syncer) must not drive the global bucket into a
    debt that refuses every host for seconds."""
    return min(unsent, math.ceil(burst + rate * min(max(elapsed_s, 0.0), 1.0)))


def fallback_limits(rate: float, burst: float, fallback: str, hosts_seen: int) -> tuple[float, float]:
    """The limit a host enforces alone while Valkey is unreachable: all of it (``per_host``, what HAProxy, nginx
    and Envoy's local limit do), or its share of the hosts last seen (``share``; the burst shared too, at least one
    token, so the cluster stays within R·t + B)."""
    if fallback != "share" or hosts_seen <= 1:
        return rate, burst
    return rate / hosts_seen, max(1.0, burst / hosts_seen)


class Moved(NamedTuple):
    """A bucket slot whose admitted count moved, as the syncer read it under its stripe lock."""

    slot: int
    key_hash: int
    tokens_u: int
    count: int  # the slot's admitted counter (monotonic for this key)


class Pick(NamedTuple):
    """A key chosen for this sync: what to send, and the counter value it covers (for the write-back)."""

    slot: int
    key_hash: int
    sent: int  # admitted requests sent (after ``clamp_sent``)
    count: int


def matters(tokens_u: int, burst: float, unsent: int, recently_synced: bool) -> bool:
    """Worth a round trip: the replica is below half its burst (near the limit somewhere), or its unsent count
    reached half a burst (a client spread thinly over many hosts), or it was synced within ``RECENT_S`` (keep a
    contended key replicated). Anything else (a client far below its limit, a flood of one-request addresses) waits:
    its count is not lost, it is sent with the key's next sync."""
    half = burst * MATTERS_BELOW
    return recently_synced or tokens_u < half * UNIT or unsent >= half


def batches(picks: Iterable[Pick], size: int = MAX_BATCH_KEYS) -> list[list[Pick]]:
    """Round trips of at most ``size`` keys each."""
    out: list[list[Pick]] = []
    for p in picks:
        if not out or len(out[-1]) >= size:
            out.append([])
        out[-1].append(p)
    return out
