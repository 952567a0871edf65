"""Session-ticket keys shared by the whole fleet, rotated on a schedule, never written to disk.

A TLS 1.3 ticket is sealed by the worker that issues it; the client may come back on any worker (SO_REUSEPORT
spreads connections by 4-tuple), so every worker must hold the same keys. They live in the fleet's anonymous
shared memory, seeded by the supervisor from ``os.urandom`` before it forks.

Rotation is a one-way ratchet on epochs (``epoch = floor(unix time / rotation_s)``)::

    secret[e + 1] = HMAC-SHA256(secret[e], "sentin8 ticket ratchet")

The shared region holds three slots, indexed by ``epoch % 3``: the previous epoch's secret, the current
one's and, in cluster mode, the next one's when it was announced ahead (a reseed,
``sentin8.cluster.ticket_state``). Any process that finds the newest slot behind the clock ratchets forward and
writes the slots itself.
The ratchet is deterministic, so processes racing to write a slot write the same bytes; a reader that catches
a slot mid-write sees its digest disagree and ratchets from the other slot instead. Old secrets are
overwritten, and a secret cannot be computed from a later one: once an epoch is two rotations old, nobody
can open its tickets any more (forward secrecy for tickets, as with nginx's rotated ``ssl_session_ticket_key``).

In cluster mode the resolver's ticket syncer ``install``s the cluster's slots (unwrapped from Valkey) and bumps a
generation word: every process drops its cached keys on the next handshake and reads the new slots.

Tickets sealed under the current epoch's key decrypt; those of the previous epoch still decrypt (and the
handshake gets a fresh ticket); older ones fall back to a full handshake.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from hmac import compare_digest  # a global, not an attribute lookup per resumed handshake

_SLOT = struct.Struct("<Q32s8s")  # epoch + 1 (0 = empty), secret, digest of both
SLOTS = 3
_HEADER = 8  # the generation: bumped by ``install`` so every process drops its cached keys
_RATCHET = b"sentin8 ticket ratchet"


def _digest(stored_epoch: int, secret: bytes) -> bytes:
    return hashlib.blake2b(stored_epoch.to_bytes(8, "little") + secret, digest_size=8).digest()


def ratchet(secret: bytes) -> bytes:
    """One epoch forward: the next epoch's secret (one-way: the previous cannot be computed from it)."""
    return hmac.new(secret, _RATCHET, hashlib.sha256).digest()


_ratchet = ratchet


@dataclass(frozen=True, slots=True)
class TicketKey:
    """What OpenSSL needs to seal or open a ticket: a 16-byte name sent in the clear with the ticket, an
    HMAC-SHA256 key and an AES-256-CBC key, all derived from one epoch's secret."""

    epoch: int
    name: bytes
    hmac_key: bytes
    aes_key: bytes

    @classmethod
    def derive(cls, epoch: int, secret: bytes) -> TicketKey:
        def part(label: bytes) -> bytes:
            return hmac.new(secret, label, hashlib.sha256).digest()

        return cls(epoch, part(b"sentin8 ticket name")[:16], part(b"sentin8 ticket hmac"), part(b"sentin8 ticket aes"))


class TicketKeyRing:
    """The current and previous ticket keys, over a shared ``memoryview`` of ``REGION_BYTES``.

    ``seed`` once (the supervisor, before forking); then ``keys`` in any process. ``clock`` is injectable so
    tests move time instead of waiting an hour.
    """

    REGION_BYTES = _HEADER + SLOTS * _SLOT.size

    def __init__(self, view: memoryview, rotation_s: float, clock: Callable[[], float] = time.time) -> None:
        if len(view) < self.REGION_BYTES:
            raise ValueError("ticket key region too small")
        if rotation_s <= 0:
            raise ValueError("rotation_s must be positive")
        self._gen = view[:_HEADER].cast("Q")
        self._view = view[_HEADER:]
        self.rotation_s = rotation_s
        self.clock = clock
        self._cached: tuple[int, int, TicketKey, TicketKey | None] | None = None
        self.rotations = 0  # epochs this process ratcheted into (it was the first to need them)

    def epoch(self, now: float | None = None) -> int:
        t = self.clock() if now is None else now
        return int(t // self.rotation_s)

    def seed(self) -> None:
        """Fresh random material for the current epoch, replacing whatever the region held."""
        self._view[: SLOTS * _SLOT.size] = bytes(SLOTS * _SLOT.size)
        self._write(self.epoch(), os.urandom(32))
        self._gen[0] += 1
        self._cached = None

    def install(self, secrets: dict[int, bytes]) -> None:
        """Replace the slots with ``secrets`` (epoch → secret, at most three consecutive epochs): the cluster's
        shared ratchet, written by its one writer (the resolver's ticket syncer). Every process's cache goes."""
        if not 0 < len(secrets) <= SLOTS or max(secrets) - min(secrets) >= SLOTS:
            raise ValueError("install takes one to three consecutive epochs")
        for epoch in sorted(secrets):
            self._write(epoch, secrets[epoch])
        for i in set(range(SLOTS)) - {e % SLOTS for e in secrets}:  # after: a reader always finds a slot
            self._view[i * _SLOT.size : (i + 1) * _SLOT.size] = bytes(_SLOT.size)  # no stale local secret left
        self._gen[0] += 1
        self._cached = None

    def slots(self) -> dict[int, bytes]:
        """The epochs and secrets the region holds now (for the syncer: what the fleet seals with)."""
        return self._read()

    def keys(self) -> tuple[TicketKey, TicketKey | None]:
        """(current, previous); previous is None in the fleet's first epoch. Cached per epoch and generation."""
        epoch = self.epoch()
        gen = self._gen[0]
        cached = self._cached
        if cached is not None and cached[0] >= epoch and cached[1] == gen:
            return cached[2], cached[3]  # also when the wall clock stepped back: keep the newest key
        current, previous = self._load(epoch)
        self._cached = (max(epoch, current.epoch), gen, current, previous)
        return current, previous

    def lookup(self, name: bytes) -> tuple[TicketKey, bool] | None:
        """The key a ticket names, and whether it is the current one; None when it is unknown or too old."""
        current, previous = self.keys()
        if compare_digest(name, current.name):
            return current, True
        if previous is not None and compare_digest(name, previous.name):
            return previous, False
        return None

    # -- the shared slots --------------------------------------------------------------------------

    def _read(self, attempts: int = 100) -> dict[int, bytes]:
        slots: dict[int, bytes] = {}
        for i in range(SLOTS):
            for _ in range(attempts):  # a slot caught mid-write is read again: the writer is a memcpy away
                raw = bytes(self._view[i * _SLOT.size : (i + 1) * _SLOT.size])
                stored, secret, digest = _SLOT.unpack(raw)
                if not stored:
                    break
                if compare_digest(digest, _digest(stored, secret)):
                    slots[stored - 1] = secret
                    break
        return slots

    def _write(self, epoch: int, secret: bytes) -> None:
        i = epoch % SLOTS
        # One slice assignment: the digest tells a reader whether it caught the slot mid-write.
        self._view[i * _SLOT.size : (i + 1) * _SLOT.size] = _SLOT.pack(epoch + 1, secret, _digest(epoch + 1, secret))

    def _load(self, epoch: int) -> tuple[TicketKey, TicketKey | None]:
        slots = self._read()
        if not slots:
            raise RuntimeError("ticket key region was never seeded")
        behind = [e for e in slots if e <= epoch]
        if epoch in slots or not behind:
            # the clock's epoch is there (or the clock stepped back behind every slot: keep the oldest)
            current = epoch if epoch in slots else min(slots)
            previous = slots.get(current - 1)
            return (
                TicketKey.derive(current, slots[current]),
                TicketKey.derive(current - 1, previous) if previous is not None else None,
            )
        # Ratchet forward from the newest slot not ahead of the clock, one epoch at a time (deterministic, so
        # every process lands on the same secret whichever slot it started from).
        newest = max(behind)
        previous, secret = slots[newest], slots[newest]
        for _ in range(newest, epoch):
            previous, secret = secret, _ratchet(secret)
        if newest < epoch - 1:
            self._write(epoch - 1, previous)  # keep "previous" readable for late starters
        self._write(epoch, secret)
        self.rotations += 1
        return TicketKey.derive(epoch, secret), TicketKey.derive(epoch - 1, previous)
