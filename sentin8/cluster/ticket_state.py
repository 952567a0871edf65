"""The cluster's shared session-ticket ratchet, as it is kept in Valkey: wrapped, never a ticket key in the clear.

Every host's fleet seals tickets from one ratchet (``sentin8.ticketkeys``): ``secret[e + 1] = ratchet(secret[e])``.
Cluster mode makes that ratchet one for all hosts: its state ``(epoch, secret[epoch])``, plus the next reseed
when one is announced, is one Valkey value ``sentin8:{<cluster_id>}:tickets``, sealed with AES-256-GCM under a
key-encryption key (KEK) that only hosts holding the operator secret (``cluster.secret_env``) can derive::

    KEK  = HKDF-SHA256(ikm = operator secret, salt = "sentin8 ticket kek v1", info = cluster_id)
    blob = "s8t1" ‖ epoch (8) ‖ nonce (12) ‖ AESGCM(KEK).encrypt(nonce, state, aad = "s8t1" ‖ cluster_id ‖ epoch)

The AAD binds the blob to its cluster and its epoch: a blob copied from another cluster, or with its epoch edited
(to make hosts ratchet from the wrong place), fails authentication and is refused like a tampered one.

Post-compromise security: the ratchet is one-way, so a stolen secret opens that epoch's tickets and every later
one, until the next *reseed*. The first epoch of each UTC day (``reseed_epoch``) does not follow the ratchet:
``secret[r] = HMAC(ratchet(secret[r - 1]), "sentin8 ticket reseed" ‖ seed)`` with a fresh 32-byte ``seed`` from
``os.urandom``. The seed is announced one epoch ahead (written into the state during epoch ``r - 1``), so every
host's syncer reads it and installs epoch ``r``'s secret in shared memory before any worker needs it. A host that
missed the announcement (Valkey unreachable) ratchets plainly and holds keys nobody else has: its tickets resume
at home only, the others' cost it a full handshake, and its ``/health`` says ``ticket_keys: "local"``.

Sans-IO: the KEK, wrap/unwrap and the epoch arithmetic; the syncer in ``supervisor/ticket_sync.py`` does the I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from dataclasses import dataclass, replace

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..ticketkeys import ratchet

MAGIC = b"s8t1"
_HEAD = struct.Struct("<4sQ12s")  # magic, epoch, nonce
_BODY = struct.Struct("<32sQ32s")  # secret[epoch], reseed epoch (0 = none announced), its seed
_KEK_SALT = b"sentin8 ticket kek v1"
_RESEED = b"sentin8 ticket reseed"
DAY_S = 86400
MAX_CATCH_UP = 100_000  # epochs: a state older than this is replaced, not ratcheted through


class UnwrapError(ValueError):
    """The blob is not a ticket state this host can open: another secret, another cluster, tampered, truncated."""


def state_key(cluster_id: str) -> str:
    return f"sentin8:{{{cluster_id}}}:tickets"


def derive_kek(secret: bytes, cluster_id: str) -> bytes:
    """The 32-byte AES-256-GCM key for this cluster's ticket state: hosts with another secret or another
    cluster id derive another key and cannot unwrap."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=_KEK_SALT, info=b"cluster " + cluster_id.encode())
    return hkdf.derive(secret)


@dataclass(frozen=True, slots=True)
class TicketState:
    """The ratchet at ``epoch``, and the reseed announced for ``reseed_at`` (0 = none) with its ``seed``."""

    epoch: int
    secret: bytes
    reseed_at: int = 0
    seed: bytes = b""

    def __post_init__(self) -> None:
        if len(self.secret) != 32 or self.epoch < 0:
            raise ValueError("a ticket state is an epoch and a 32-byte secret")
        if self.reseed_at and (self.reseed_at <= self.epoch or len(self.seed) != 32):
            raise ValueError("a reseed is announced for a later epoch with a 32-byte seed")


def _aad(cluster_id: str, epoch: int) -> bytes:
    return MAGIC + cluster_id.encode() + b"\0" + epoch.to_bytes(8, "little")


def wrap(kek: bytes, cluster_id: str, state: TicketState, nonce: bytes | None = None) -> bytes:
    """The state sealed for Valkey (``nonce``: tests only; a fresh random one otherwise)."""
    nonce = os.urandom(12) if nonce is None else nonce
    body = _BODY.pack(state.secret, state.reseed_at, state.seed if state.reseed_at else bytes(32))
    sealed = AESGCM(kek).encrypt(nonce, body, _aad(cluster_id, state.epoch))
    return _HEAD.pack(MAGIC, state.epoch, nonce) + sealed


def unwrap(kek: bytes, cluster_id: str, blob: bytes) -> TicketState:
    """The state a blob holds; UnwrapError when it does not authenticate under this KEK, cluster and epoch."""
    if len(blob) != _HEAD.size + _BODY.size + 16:
        raise UnwrapError(f"a ticket state is {_HEAD.size + _BODY.size + 16} bytes, got {len(blob)}")
    magic, epoch, nonce = _HEAD.unpack_from(blob)
    if magic != MAGIC:
        raise UnwrapError("not a sentin8 ticket state (unknown format)")
    try:
        body = AESGCM(kek).decrypt(nonce, blob[_HEAD.size :], _aad(cluster_id, epoch))
    except InvalidTag:
        raise UnwrapError(
            "the ticket state does not authenticate (another secret or cluster id, or tampered)"
        ) from None
    secret, reseed_at, seed = _BODY.unpack(body)
    try:
        return TicketState(epoch, secret, reseed_at, seed if reseed_at else b"")
    except ValueError as exc:
        raise UnwrapError(str(exc)) from None


def reseed(previous: bytes, seed: bytes) -> bytes:
    """A reseed epoch's secret: the ratchet's next step mixed with fresh randomness (either alone suffices)."""
    return hmac.new(ratchet(previous), _RESEED + seed, hashlib.sha256).digest()


def reseed_epoch(epoch: int, rotation_s: float) -> int:
    """The first reseed epoch after ``epoch``: the first epoch starting at or after the next UTC midnight (every
    epoch when an epoch is a day or longer)."""
    day = int(epoch * rotation_s // DAY_S)
    nxt = -(-((day + 1) * DAY_S) // rotation_s)  # ceil
    return max(epoch + 1, int(nxt))


def advance(state: TicketState, epoch: int) -> TicketState:
    """The state ratcheted forward to ``epoch`` (the announced reseed applied on the way); itself if not behind."""
    if epoch <= state.epoch:
        return state
    e, secret = state.epoch, state.secret
    reseed_at, seed = state.reseed_at, state.seed
    while e < epoch:
        e += 1
        secret = reseed(secret, seed) if e == reseed_at else ratchet(secret)
    if reseed_at and reseed_at <= epoch:
        reseed_at, seed = 0, b""
    return TicketState(epoch, secret, reseed_at, seed)


def secrets(state: TicketState, epoch: int) -> dict[int, bytes]:
    """What the fleet's shared-memory ring needs at ``epoch``: the previous, current and (if announced) next
    epoch's secrets. ``state`` must not be ahead of ``epoch`` (``advance`` it first)."""
    if state.epoch > epoch:
        raise ValueError("the state is ahead of the clock")
    out: dict[int, bytes] = {}
    if epoch - 1 >= state.epoch:
        out[epoch - 1] = advance(state, epoch - 1).secret
    current = advance(state, epoch)
    out[epoch] = current.secret
    if current.reseed_at == epoch + 1:
        out[epoch + 1] = advance(current, epoch + 1).secret
    return out


def announce(state: TicketState, epoch: int, rotation_s: float, seed: bytes) -> TicketState | None:
    """The state to publish at ``epoch``: during the epoch before a reseed, with that reseed announced (``seed``:
    fresh randomness). None when the state needs no write (announced already, or no reseed next). The stored
    state moves to the previous epoch on the way (older secrets leave Valkey; a host whose clock is a little
    behind can still compute its current epoch from it)."""
    current = advance(state, max(state.epoch, epoch - 1))
    due = reseed_epoch(epoch, rotation_s)
    if due != epoch + 1 or current.reseed_at == due:
        return None
    return replace(current, reseed_at=due, seed=seed)


def valid_through(state: TicketState, rotation_s: float) -> int:
    """The last epoch this host can compute the cluster's secret for from ``state`` alone: the epoch before the
    next reseed it has not been told about."""
    if state.reseed_at:
        return reseed_epoch(state.reseed_at, rotation_s) - 1
    return reseed_epoch(state.epoch, rotation_s) - 1


def too_old(state: TicketState, epoch: int) -> bool:
    """A state so far behind (every host down for a long time) that a fresh one replaces it."""
    return epoch - state.epoch > MAX_CATCH_UP
