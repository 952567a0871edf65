"""The syncer's ledger (sans-IO): per bucket slot, the admitted count this host has already sent to Valkey.

Workers never reset anything: each slot's admitted counter only grows (``shm/ratelimit.py``), and what moved
since the last sync is the counter less the value recorded here. The ledger is fixed-size (four arrays of the
table's slot count), so a rotating-address flood cannot grow the syncer's memory.

Two events restart a slot's baseline:
- another key took the slot (its counter started at zero when it was installed): everything it counts is new;
- a new *epoch* (``new_epoch``: the syncer (re)gained Valkey after an outage, or is starting): the baseline of
  every slot becomes its counter at that instant (``BucketTable.counts``, one pass over the table). What was
  admitted before was judged by the fallback limit already, and sending it would drive every key that was busy
  during the outage into debt, a storm of 429s when Valkey returns; what is admitted after is sent, also by a key
  the syncer first sees after the epoch began (its first requests must reach the global bucket: skipped, the
  write-back would refill its replica to the global level and admit them twice).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

from . import bucket_merge
from .bucket_merge import Moved, Pick


class SyncBook:
    def __init__(self, slots: int) -> None:
        self.key_hash = array("Q", bytes(8 * slots))
        self.count = array("Q", bytes(8 * slots))
        self.synced_at = array("d", bytes(8 * slots))

    def new_epoch(self, table: Iterable[Moved]) -> None:
        """Every slot's baseline at its counter now (``table``: each occupied slot, as ``BucketTable.counts``
        reads it); nothing admitted before is sent."""
        for m in table:
            s = m.slot
            self.key_hash[s], self.count[s], self.synced_at[s] = m.key_hash, m.count, 0.0

    def unsent(self, m: Moved) -> int:
        """Admitted on this host since the key's last sync (or the epoch's start)."""
        s = m.slot
        if self.key_hash[s] != m.key_hash:
            self.key_hash[s], self.count[s], self.synced_at[s] = m.key_hash, 0, 0.0
        return max(0, m.count - self.count[s])

    def plan(self, moved: Iterable[Moved], now: float, rate: float, burst: float, elapsed_s: float) -> list[Pick]:
        """The keys worth syncing now (``bucket_merge.matters``), each with the count to send."""
        picks = []
        for m in moved:
            unsent = self.unsent(m)
            recent = now - self.synced_at[m.slot] < bucket_merge.RECENT_S
            if bucket_merge.matters(m.tokens_u, burst, unsent, recent):
                sent = bucket_merge.clamp_sent(unsent, rate, burst, elapsed_s)
                picks.append(Pick(m.slot, m.key_hash, sent, m.count))
        return picks

    def synced(self, picks: Iterable[Pick], now: float) -> None:
        """Valkey took these counts: the baseline moves to the counter value each pick covered."""
        for p in picks:
            if self.key_hash[p.slot] == p.key_hash:
                self.count[p.slot] = p.count
                self.synced_at[p.slot] = now
