"""The handshake's key shares, freed once it is done.

OpenSSL keeps the peer's key share (``s->s3.peer_tmp``) and our own ephemeral key (``s->s3.tmp.pkey``) until
SSL_free: nothing reads them once the handshake has derived its secrets (the group's name is kept apart, in
``s3.group_id``; TLS 1.3 has no renegotiation), but for X25519MLKEM768 the client's share is an ML-KEM-768
public key with its expanded matrix: measured 7.0 KiB per idle server connection (malloc'd, in-process, 1,000
connections: 30.7 -> 23.7 KiB), for the connection's whole life; nginx keeps it too. OpenSSL has no call to
drop them, so ``release_at`` does what ``ssl3_free`` does for these two fields: it finds each one's
slot in the connection struct, proven as ``openssl_private`` proves addresses (never a guess): the key comes
from ``SSL_get_peer_tmp_key`` / ``SSL_get_tmp_key`` (SSL_ctrl 109 / 133, which take a reference); the slot
is the only word of the struct's first ``_SCAN_BYTES`` that holds that pointer, found once per process on
the first connection that has the key, and every connection's slot is checked to hold its own key before it
is cleared and the key freed. Anything unexpected (a symbol missing, no slot or two) leaves the keys where
they are, as before, said once in the log.

``tls_connection.RecordIO.handshake`` calls ``release_at`` once its handshake has completed.
"""

from __future__ import annotations

import functools
import logging

from OpenSSL import SSL

try:
    import cython  # the compiled build calls the two functions through C pointers (key_shares.pxd)
except ImportError:  # a pure install without Cython: every call through cffi

    class cython:  # type: ignore[no-redef]
        compiled = False


from sentin8 import openssl_private

log = logging.getLogger(__name__)
_ffi = SSL._ffi  # pyOpenSSL's compiled ffi (the ABI-mode one's ``new`` and ``cast`` are Python wrappers)

_CTRL_GET_PEER_TMP_KEY = 109  # SSL_CTRL_GET_PEER_TMP_KEY
_CTRL_GET_TMP_KEY = 133  # SSL_CTRL_GET_TMP_KEY
_SCAN_BYTES = 4096  # the slots sit at ~1.2 KB of the ~6 KB SSL_CONNECTION (OpenSSL 3.x/4.0); the scan stays inside
_WORD = 8  # 64-bit builds only: the ELF64 symbol reader (openssl_private) proves nothing elsewhere


class KeyShares:
    """The calls and the proven slots of ``release_at`` (one per process). The compiled build calls the two
    functions through C pointers (``key_shares.pxd``); the pure build through these cffi ones."""

    def __init__(self) -> None:
        found = openssl_private.resolve(("SSL_ctrl", "EVP_PKEY_free"))
        self.usable = found is not None
        self.slots: dict[int, int | None] = {}  # ctrl -> byte offset of its field (None: not provable)
        if found is None:
            log.warning("TLS: SSL_ctrl/EVP_PKEY_free are not reachable; handshake key shares stay until close")
            return
        self.ctrl = openssl_private.function(found["SSL_ctrl"], "long (*)(void *, int, long, void *)")
        self.free = openssl_private.function(found["EVP_PKEY_free"], "void (*)(void *)")
        if cython.compiled:
            global c_SSL_ctrl, c_EVP_PKEY_free
            c_SSL_ctrl = cython.cast(_ctrl_fn, cython.cast(cython.size_t, found["SSL_ctrl"]))  # noqa: F821
            c_EVP_PKEY_free = cython.cast(_free_fn, cython.cast(cython.size_t, found["EVP_PKEY_free"]))  # noqa: F821

    def release(self, ssl: int, ctrl: int) -> bool:
        """Free the key behind ``ctrl`` on the connection whose ``SSL *`` is at ``ssl``; True when one was
        freed (the connection's reference, as ``ssl3_free`` would; the field is cleared first)."""
        key = self._key(ssl, ctrl)
        if not key:
            return False
        try:
            slot = self.slots.get(ctrl, -1)
            if slot == -1:
                slot = self.slots[ctrl] = self._find(ssl, key, ctrl)
            if slot is None or not take_word(ssl + slot, key):
                return False  # not provable, or not where it was proven: leave it
            self._free(key)
            return True
        finally:
            self._free(key)  # the reference SSL_ctrl gave us

    def _key(self, ssl: int, ctrl: int) -> int:
        """The key's address (SSL_ctrl takes a reference), 0 when the connection has none."""
        if cython.compiled:
            key = cython.declare(cython.p_void, cython.NULL)
            got = c_SSL_ctrl(cython.cast(cython.p_void, ssl), ctrl, 0, cython.address(key))
            return cython.cast(cython.size_t, key) if got == 1 else 0
        out = _ffi.new("void **")
        if self.ctrl(_ffi.cast("void *", ssl), ctrl, 0, out) != 1:
            return 0
        return int(_ffi.cast("uintptr_t", out[0]))

    def _free(self, key: int) -> None:
        if cython.compiled:
            c_EVP_PKEY_free(cython.cast(cython.p_void, key))
        else:
            self.free(_ffi.cast("void *", key))

    @staticmethod
    def _find(ssl: int, pointer: int, ctrl: int) -> int | None:
        words = memoryview(_ffi.buffer(_ffi.cast("char *", ssl), _SCAN_BYTES)).cast("Q").tolist()
        hits = [i * _WORD for i, w in enumerate(words) if w == pointer]
        if len(hits) != 1:
            log.warning(
                "TLS: the key share's slot (SSL_ctrl %d) is not provable (%d matches); it stays", ctrl, len(hits)
            )
            return None
        return hits[0]


def take_word(address: int, expected: int) -> bool:
    """Clear the pointer-sized word at ``address`` if it holds ``expected``; whether it did."""
    if cython.compiled:
        field = cython.cast(cython.pp_void, address)
        if field[0] != cython.cast(cython.p_void, expected):
            return False
        field[0] = cython.NULL
        return True
    field = _ffi.cast("uintptr_t *", address)
    if field[0] != expected:
        return False
    field[0] = 0
    return True


@functools.cache
def process_shares() -> KeyShares:
    """This process's calls and proven slots, made on the first completed handshake."""
    return KeyShares()


def release_at(ssl: int) -> int:
    """After a completed handshake: free the peer's key share and our ephemeral key on the connection whose
    ``SSL *`` is at ``ssl``; how many were freed (0 when the layout could not be proven, or a resumption without
    key exchange had none)."""
    shares = process_shares()
    if not shares.usable:
        return 0
    return shares.release(ssl, _CTRL_GET_PEER_TMP_KEY) + shares.release(ssl, _CTRL_GET_TMP_KEY)
