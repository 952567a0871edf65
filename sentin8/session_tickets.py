"""Seal and open TLS session tickets with the fleet's keys (``TicketKeyRing``) instead of per-process ones.

OpenSSL gives every ``SSL_CTX`` random ticket keys of its own, so a ticket issued by one worker does not open
on another. ``SSL_CTX_set_tlsext_ticket_key_evp_cb`` hands ticket sealing to a callback: on issue it names
the key and initialises AES-256-CBC and HMAC-SHA256 with it; on resumption it finds the key by name (current
or previous → 2 = "resume, and issue a fresh ticket"; unknown → 0 = full handshake). pyOpenSSL does not bind
that function, so it and the two EVP initialisers are reached through ``sentin8.openssl_private``.

The callback runs inside ``SSL_do_handshake`` (ctypes takes the GIL for it). It never raises into OpenSSL:
any failure returns "no ticket" / "unknown key", which costs a full handshake, never a connection.
"""

from __future__ import annotations

import ctypes
import logging
import os

from OpenSSL import SSL

from sentin8 import openssl_private
from sentin8.ticketkeys import TicketKey, TicketKeyRing

log = logging.getLogger(__name__)

_NAMES = (
    "SSL_CTX_set_tlsext_ticket_key_evp_cb",
    "EVP_EncryptInit_ex",
    "EVP_DecryptInit_ex",
    "EVP_MAC_CTX_set_params",
    "EVP_aes_256_cbc",
)
_OSSL_PARAM_UTF8_STRING = 4
_OSSL_PARAM_OCTET_STRING = 5
_OSSL_PARAM_UNMODIFIED = ctypes.c_size_t(-1).value
_IV_LEN = 16  # AES-CBC

_TicketCallback = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int
)


class _OsslParam(ctypes.Structure):
    _fields_ = [
        ("key", ctypes.c_char_p),
        ("data_type", ctypes.c_uint),
        ("data", ctypes.c_void_p),
        ("data_size", ctypes.c_size_t),
        ("return_size", ctypes.c_size_t),
    ]


class _Functions:
    def __init__(self, addresses: dict[str, int]) -> None:
        f = openssl_private.function
        vp, i = ctypes.c_void_p, ctypes.c_int
        self.set_cb = f(addresses["SSL_CTX_set_tlsext_ticket_key_evp_cb"], ctypes.c_long, vp, _TicketCallback)
        self.encrypt_init = f(addresses["EVP_EncryptInit_ex"], i, vp, vp, vp, ctypes.c_char_p, vp)
        self.decrypt_init = f(addresses["EVP_DecryptInit_ex"], i, vp, vp, vp, ctypes.c_char_p, vp)
        self.mac_set_params = f(addresses["EVP_MAC_CTX_set_params"], i, vp, ctypes.POINTER(_OsslParam))
        self.cipher = f(addresses["EVP_aes_256_cbc"], vp)()


def _functions() -> _Functions | None:
    addresses = openssl_private.resolve(_NAMES)
    return _Functions(addresses) if addresses is not None else None


def available() -> bool:
    """Whether fleet-wide tickets can be installed on this build of the bundled OpenSSL."""
    return _functions() is not None


class TicketSealer:
    """Installs the fleet's ticket keys on server contexts. Keep the instance alive as long as the contexts:
    it owns the C callback OpenSSL calls."""

    def __init__(self, ring: TicketKeyRing) -> None:
        fns = _functions()
        if fns is None:
            raise RuntimeError("the bundled OpenSSL's ticket-key hook is not reachable")
        self.ring = ring
        self._fns = fns
        self._callback = _TicketCallback(self._on_ticket)
        self._digest = b"SHA256"  # 6 bytes, as the OSSL_PARAM below says
        self._params: dict[TicketKey, ctypes.Array[_OsslParam]] = {}
        # Counters (plain attributes).
        self.sealed = 0
        self.opened_current = 0
        self.opened_previous = 0
        self.unknown = 0
        self.errors = 0

    def install(self, ctx: SSL.Context) -> None:
        """Seal this context's tickets with the ring's keys (the front context is the one OpenSSL uses)."""
        if self._fns.set_cb(openssl_private.pointer_of(ctx._context), self._callback) != 1:
            raise RuntimeError("SSL_CTX_set_tlsext_ticket_key_evp_cb failed")
        # A ticket opens for one to two rotation periods (its epoch and the next): promise the client the
        # one it can count on (the ticket's lifetime hint; OpenSSL's default is a fixed 7200 s).
        ctx.set_timeout(max(1, int(self.ring.rotation_s)))

    def _mac_params(self, key: TicketKey) -> ctypes.Array[_OsslParam]:
        """The HMAC key and digest as OSSL_PARAMs, built once per key (two keys live at a time)."""
        params = self._params.get(key)
        if params is None:
            if len(self._params) >= 4:
                self._params.clear()
            params = self._params[key] = self._build_mac_params(key)
        return params

    def _build_mac_params(self, key: TicketKey) -> ctypes.Array[_OsslParam]:
        hmac_key = ctypes.create_string_buffer(key.hmac_key, len(key.hmac_key))
        digest = ctypes.create_string_buffer(self._digest)
        unmodified = _OSSL_PARAM_UNMODIFIED
        params = (_OsslParam * 3)(
            _OsslParam(b"key", _OSSL_PARAM_OCTET_STRING, ctypes.cast(hmac_key, ctypes.c_void_p), 32, unmodified),
            _OsslParam(b"digest", _OSSL_PARAM_UTF8_STRING, ctypes.cast(digest, ctypes.c_void_p), 6, unmodified),
            _OsslParam(None, 0, None, 0, 0),
        )
        params._keep = (hmac_key, digest)  # type: ignore[attr-defined]  # alive as long as the array
        return params

    def _on_ticket(self, _ssl: int, key_name: int, iv: int, cipher_ctx: int, mac_ctx: int, enc: int) -> int:
        try:
            if enc:
                key, _ = self.ring.keys()
                ctypes.memmove(key_name, key.name, 16)
                ctypes.memmove(iv, os.urandom(_IV_LEN), _IV_LEN)
                if self._fns.encrypt_init(cipher_ctx, self._fns.cipher, None, key.aes_key, iv) != 1:
                    self.errors += 1
                    return -1
                if self._fns.mac_set_params(mac_ctx, self._mac_params(key)) != 1:
                    self.errors += 1
                    return -1
                self.sealed += 1
                return 1
            found = self.ring.lookup(ctypes.string_at(key_name, 16))
            if found is None:
                self.unknown += 1
                return 0  # a full handshake, and a fresh ticket
            key, current = found
            if self._fns.mac_set_params(mac_ctx, self._mac_params(key)) != 1:
                self.errors += 1
                return 0
            if self._fns.decrypt_init(cipher_ctx, self._fns.cipher, None, key.aes_key, iv) != 1:
                self.errors += 1
                return 0
            if current:
                self.opened_current += 1
            else:
                self.opened_previous += 1
            # 2 = resume and issue a fresh ticket. With 1, OpenSSL sends no NewSessionTicket after a TLS 1.3
            # resumption, and a client that (rightly) uses each ticket once falls back to a full handshake
            # every other connection.
            return 2
        except Exception:  # never unwind into OpenSSL
            self.errors += 1
            log.exception("TLS: ticket key callback failed")
            return -1 if enc else 0
