"""Seal and open TLS session tickets with the fleet's keys (``TicketKeyRing``) instead of per-process ones.

OpenSSL gives every ``SSL_CTX`` random ticket keys of its own, so a ticket issued by one worker does not open
on another. ``SSL_CTX_set_tlsext_ticket_key_evp_cb`` hands ticket sealing to a callback: on issue it names
the key and initialises AES-256-CBC and HMAC-SHA256 with it; on resumption it finds the key by name (current
or previous → 2 = "resume, and issue a fresh ticket"; unknown → 0 = full handshake). pyOpenSSL does not bind
that function, so it and the two EVP initialisers are reached through ``sentin8.openssl_private``.

The callback runs inside ``SSL_do_handshake`` (cffi takes the GIL for it). It never raises into OpenSSL:
any failure returns "no ticket" / "unknown key", which costs a full handshake, never a connection.
"""

from __future__ import annotations

import logging

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
    "RAND_bytes",
)
_OSSL_PARAM_UTF8_STRING = 4
_OSSL_PARAM_OCTET_STRING = 5
_OSSL_PARAM_UNMODIFIED = (1 << 64) - 1  # (size_t)-1
_IV_LEN = 16  # AES-CBC
# pyOpenSSL's ffi is compiled (its memmove is a C method; the ABI-mode ffi's a Python wrapper around it), and
# cffi makes pointer types unique across ffi instances, so it takes the callback's ``unsigned char *`` as is
_memmove = SSL._ffi.memmove

# The callback's signature and the OSSL_PARAM layout, in openssl_private's ABI-mode ffi. cffi rather than
# ctypes because this runs twice in every resumed handshake: a ctypes callback entry plus its foreign calls
# (memmove and string_at are foreign calls too) measured ~37k instructions a callback, cffi's ~9k.
_ffi = openssl_private.ffi
_ffi.cdef(
    """
    typedef struct { const char *key; unsigned int data_type; void *data; size_t data_size; size_t return_size; }
        OSSL_PARAM;
    typedef int (*ticket_cb)(void *, unsigned char *, unsigned char *, void *, void *, int);
    """
)


class _Functions:
    def __init__(self, addresses: dict[str, int]) -> None:
        f = openssl_private.function
        self.set_cb = f(addresses["SSL_CTX_set_tlsext_ticket_key_evp_cb"], "long (*)(void *, ticket_cb)")
        init = "int (*)(void *, void *, void *, const unsigned char *, const unsigned char *)"
        self.encrypt_init = f(addresses["EVP_EncryptInit_ex"], init)
        self.decrypt_init = f(addresses["EVP_DecryptInit_ex"], init)
        self.mac_set_params = f(addresses["EVP_MAC_CTX_set_params"], "int (*)(void *, const OSSL_PARAM *)")
        self.cipher = f(addresses["EVP_aes_256_cbc"], "void *(*)(void)")()
        # the IV straight into OpenSSL's buffer from its own CSPRNG (as nginx's ticket callback does): no
        # getrandom syscall and no bytes object per ticket, as os.urandom would cost
        self.rand_bytes = f(addresses["RAND_bytes"], "int (*)(unsigned char *, int)")


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
        # error=0 if an exception ever escaped _on_ticket (it catches them): "no ticket" / "unknown key"
        self._callback = _ffi.callback("ticket_cb", self._on_ticket, error=0)
        self._digest = b"SHA256"  # 6 bytes, as the OSSL_PARAM below says
        self._params: dict[bytes, tuple[object, ...]] = {}  # by key name: a bytes hash is cached, a key's is not
        # Counters (plain attributes).
        self.sealed = 0
        self.opened_current = 0
        self.opened_previous = 0
        self.unknown = 0
        self.errors = 0

    def install(self, ctx: SSL.Context) -> None:
        """Seal this context's tickets with the ring's keys (the front context is the one OpenSSL uses)."""
        if self._fns.set_cb(openssl_private.pointer(ctx._context), self._callback) != 1:
            raise RuntimeError("SSL_CTX_set_tlsext_ticket_key_evp_cb failed")
        # A ticket opens for one to two rotation periods (its epoch and the next): promise the client the
        # one it can count on (the ticket's lifetime hint; OpenSSL's default is a fixed 7200 s).
        ctx.set_timeout(max(1, int(self.ring.rotation_s)))

    def _mac_params(self, key: TicketKey) -> object:
        """The HMAC key and digest as OSSL_PARAMs, built once per key (two keys live at a time)."""
        params = self._params.get(key.name)
        if params is None:
            if len(self._params) >= 4:
                self._params.clear()
            params = self._params[key.name] = self._build_mac_params(key)
        return params[0]

    def _build_mac_params(self, key: TicketKey) -> tuple[object, ...]:
        """(the OSSL_PARAM array, what it points into): the buffers live as long as the array's entry."""
        hmac_key = _ffi.new("unsigned char[]", key.hmac_key)
        digest = _ffi.new("char[]", self._digest)
        names = (_ffi.new("char[]", b"key"), _ffi.new("char[]", b"digest"))
        params = _ffi.new(
            "OSSL_PARAM[3]",
            [
                (names[0], _OSSL_PARAM_OCTET_STRING, hmac_key, 32, _OSSL_PARAM_UNMODIFIED),
                (names[1], _OSSL_PARAM_UTF8_STRING, digest, 6, _OSSL_PARAM_UNMODIFIED),
                (_ffi.NULL, 0, _ffi.NULL, 0, 0),
            ],
        )
        return params, hmac_key, digest, names

    def _on_ticket(self, _ssl: object, key_name: object, iv: object, cipher: object, mac: object, enc: int) -> int:
        # the pointers are cffi cdata: memmove into them, never keep them past the call
        try:
            if enc:
                key, _ = self.ring.keys()
                _memmove(key_name, key.name, 16)
                if self._fns.rand_bytes(iv, _IV_LEN) != 1:
                    self.errors += 1
                    return -1
                if self._fns.encrypt_init(cipher, self._fns.cipher, _ffi.NULL, key.aes_key, iv) != 1:
                    self.errors += 1
                    return -1
                if self._fns.mac_set_params(mac, self._mac_params(key)) != 1:
                    self.errors += 1
                    return -1
                self.sealed += 1
                return 1
            found = self.ring.lookup(_ffi.buffer(key_name, 16)[:])
            if found is None:
                self.unknown += 1
                return 0  # a full handshake, and a fresh ticket
            key, current = found
            if self._fns.mac_set_params(mac, self._mac_params(key)) != 1:
                self.errors += 1
                return 0
            if self._fns.decrypt_init(cipher, self._fns.cipher, _ffi.NULL, key.aes_key, iv) != 1:
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
