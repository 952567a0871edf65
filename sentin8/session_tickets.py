"""Seal and open TLS session tickets with the fleet's keys (``TicketKeyRing``) instead of per-process ones.

OpenSSL gives every ``SSL_CTX`` random ticket keys of its own, so a ticket issued by one worker does not open
on another. ``SSL_CTX_set_tlsext_ticket_key_evp_cb`` hands ticket sealing to a callback: on issue it names
the key and initialises AES-256-CBC and HMAC-SHA256 with it; on resumption it finds the key by name (current
or previous → 2 = "resume, and issue a fresh ticket"; unknown → 0 = full handshake). pyOpenSSL does not bind
that function, so it and the two EVP initialisers are reached through ``sentin8.openssl_private``.

The callback runs inside ``SSL_do_handshake``, twice in every resumed handshake (open the client's ticket, seal
the next one). The compiled build installs a C function (``_c_on_ticket``): OpenSSL calls it directly, it finds
its sealer in the context's ex_data (the callback has no argument of its own) and calls OpenSSL through C
pointers. The pure build installs a cffi callback over the same ``_on_ticket``. It never raises into OpenSSL:
any failure returns "no ticket" / "unknown key", which costs a full handshake, never a connection.
"""

from __future__ import annotations

import logging
import weakref

from OpenSSL import SSL

from sentin8 import openssl_private
from sentin8.ticketkeys import TicketKey, TicketKeyRing

try:
    import cython  # the compiled build's callback is a C function (Cython decides it at compile time)
except ImportError:  # a pure install without Cython: the cffi callback

    class cython:  # type: ignore[no-redef]
        compiled = False


log = logging.getLogger(__name__)

_NAMES = (
    "SSL_CTX_set_tlsext_ticket_key_evp_cb",
    "EVP_EncryptInit_ex",
    "EVP_DecryptInit_ex",
    "EVP_MAC_CTX_set_params",
    "EVP_aes_256_cbc",
    "RAND_bytes",
    # the compiled build's callback finds its sealer through the context's ex_data
    "CRYPTO_get_ex_new_index",
    "SSL_CTX_set_ex_data",
    "SSL_CTX_get_ex_data",
    "SSL_get_SSL_CTX",
)
_CRYPTO_EX_INDEX_SSL_CTX = 1
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
        self.set_ex_data = f(addresses["SSL_CTX_set_ex_data"], "int (*)(void *, int, void *)")
        self.addresses = addresses


def _functions() -> _Functions | None:
    addresses = openssl_private.resolve(_NAMES)
    return _Functions(addresses) if addresses is not None else None


_ex_index = -1  # the process's SSL_CTX ex_data slot for the sealer (the compiled build's callback reads it)
# each context's sealer, held as long as the context's Python object (the C callback finds it by ex_data)
_installed: weakref.WeakKeyDictionary[SSL.Context, TicketSealer] = weakref.WeakKeyDictionary()


def _bind_c(fns: _Functions) -> int:
    """The compiled build's C pointers to the functions the callback calls, and the ex_data slot (once per
    process; the same every time after). Returns the slot."""
    global _ex_index
    if _ex_index < 0:
        new_index = openssl_private.function(
            fns.addresses["CRYPTO_get_ex_new_index"], "int (*)(int, long, void *, void *, void *, void *)"
        )
        index = new_index(_CRYPTO_EX_INDEX_SSL_CTX, 0, _ffi.NULL, _ffi.NULL, _ffi.NULL, _ffi.NULL)
        if index < 0:
            raise RuntimeError("CRYPTO_get_ex_new_index failed")
        if cython.compiled:
            a = fns.addresses
            global c_encrypt_init, c_decrypt_init, c_mac_set_params, c_rand_bytes, c_get_ctx, c_get_ex_data
            global c_cipher, c_ex_index
            c_encrypt_init = cython.cast(_cipher_init_fn, _at(a, "EVP_EncryptInit_ex"))  # noqa: F821 (the .pxd)
            c_decrypt_init = cython.cast(_cipher_init_fn, _at(a, "EVP_DecryptInit_ex"))  # noqa: F821
            c_mac_set_params = cython.cast(_mac_params_fn, _at(a, "EVP_MAC_CTX_set_params"))  # noqa: F821
            c_rand_bytes = cython.cast(_rand_fn, _at(a, "RAND_bytes"))  # noqa: F821
            c_get_ctx = cython.cast(_get_ctx_fn, _at(a, "SSL_get_SSL_CTX"))  # noqa: F821
            c_get_ex_data = cython.cast(_get_ex_fn, _at(a, "SSL_CTX_get_ex_data"))  # noqa: F821
            c_cipher = cython.cast(cython.p_void, _address(fns.cipher))
            c_ex_index = index
        _ex_index = index
    return _ex_index


def _address(cdata: object) -> int:
    """The address a cffi pointer holds (a C ``size_t`` in the compiled build)."""
    return int(_ffi.cast("uintptr_t", cdata))


def _at(addresses: dict[str, int], name: str) -> int:
    """A resolved function's address (a C ``size_t`` in the compiled build, for the casts above)."""
    return addresses[name]


def available() -> bool:
    """Whether fleet-wide tickets can be installed on this build of the bundled OpenSSL."""
    return _functions() is not None


class TicketSealer:
    """Installs the fleet's ticket keys on server contexts. Keep the instance alive as long as the contexts:
    each context it is installed on holds it (``install``), and OpenSSL's callback reaches it through them."""

    def __init__(self, ring: TicketKeyRing) -> None:
        fns = _functions()
        if fns is None:
            raise RuntimeError("the bundled OpenSSL's ticket-key hook is not reachable")
        self.ring = ring
        self._fns = fns
        self._ex_index = _bind_c(fns)
        if cython.compiled:  # OpenSSL calls the C function itself
            address = cython.cast(cython.size_t, cython.cast(cython.p_void, _c_on_ticket))
            self._callback = _ffi.cast("ticket_cb", address)
        else:  # error=0 if an exception ever escaped _on_ticket (it catches them): "no ticket" / "unknown key"
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
        pointer = openssl_private.pointer(ctx._context)
        # the context names its sealer (ex_data, for the C callback), and keeps it alive as long as it lives
        _installed[ctx] = self
        if self._fns.set_ex_data(pointer, self._ex_index, _ffi.cast("void *", id(self))) != 1:
            raise RuntimeError("SSL_CTX_set_ex_data failed")
        if self._fns.set_cb(pointer, self._callback) != 1:
            raise RuntimeError("SSL_CTX_set_tlsext_ticket_key_evp_cb failed")
        # A ticket opens for one to two rotation periods (its epoch and the next): promise the client the
        # one it can count on (the ticket's lifetime hint; OpenSSL's default is a fixed 7200 s).
        ctx.set_timeout(max(1, int(self.ring.rotation_s)))

    def _mac_address(self, key: TicketKey) -> object:
        """The HMAC key and digest as OSSL_PARAMs, built once per key (two keys live at a time): the array for
        cffi (pure build), its address (compiled build)."""
        entry = self._params.get(key.name)
        if entry is None:
            if len(self._params) >= 4:
                self._params.clear()
            entry = self._params[key.name] = self._build_mac_params(key)
        return entry[1] if cython.compiled else entry[0]

    def _build_mac_params(self, key: TicketKey) -> tuple[object, ...]:
        """(the OSSL_PARAM array, its address, what it points into): the buffers live as long as the entry."""
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
        return params, _address(params), hmac_key, digest, names

    def _on_ticket(self, _ssl: object, key_name: object, iv: object, cipher: object, mac: object, enc: int) -> int:
        """OpenSSL's ticket-key callback. The pointers are C pointers (compiled) or cffi cdata (pure): only the
        helpers below touch them, and nothing keeps them past the call."""
        try:
            if enc:
                key, _ = self.ring.keys()
                if (
                    self._seal_setup(key_name, iv, key) != 1
                    or self._cipher_init(cipher, key, iv, True) != 1
                    or self._mac_init(mac, key) != 1
                ):
                    self.errors += 1
                    return -1
                self.sealed += 1
                return 1
            found = self.ring.lookup(self._name_of(key_name))
            if found is None:
                self.unknown += 1
                return 0  # a full handshake, and a fresh ticket
            key, current = found
            if self._mac_init(mac, key) != 1 or self._cipher_init(cipher, key, iv, False) != 1:
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

    # -- the callback's OpenSSL calls: C pointers compiled, cffi pure ---------------------------------------

    def _seal_setup(self, key_name: object, iv: object, key: TicketKey) -> int:
        """Name the key in the ticket, and a random IV straight into OpenSSL's buffer from its own CSPRNG (as
        nginx's ticket callback does: no getrandom syscall, no bytes object per ticket). 1 on success."""
        name: bytes = key.name
        if cython.compiled:
            memcpy(key_name, cython.cast(cython.p_const_char, name), 16)  # noqa: F821 (the .pxd)
            return c_rand_bytes(iv, _IV_LEN)
        _memmove(key_name, name, 16)
        return self._fns.rand_bytes(iv, _IV_LEN)

    def _cipher_init(self, cipher: object, key: TicketKey, iv: object, seal: bool) -> int:
        aes: bytes = key.aes_key
        if cython.compiled:
            if seal:
                return c_encrypt_init(cipher, c_cipher, cython.NULL, aes, iv)
            return c_decrypt_init(cipher, c_cipher, cython.NULL, aes, iv)
        fns = self._fns
        return (fns.encrypt_init if seal else fns.decrypt_init)(cipher, fns.cipher, _ffi.NULL, aes, iv)

    def _mac_init(self, mac: object, key: TicketKey) -> int:
        params = self._mac_address(key)
        if cython.compiled:
            return c_mac_set_params(mac, cython.cast(cython.p_void, params))
        return self._fns.mac_set_params(mac, params)

    def _name_of(self, key_name: object) -> bytes:
        if cython.compiled:
            return cython.cast(cython.p_char, key_name)[:16]
        return _ffi.buffer(key_name, 16)[:]


def _c_on_ticket(ssl: object, key_name: object, iv: object, cipher: object, mac: object, enc: int) -> int:
    """The compiled build's C callback (``session_tickets.pxd``): the sealer of the connection's context
    (``install`` put it in the context's ex_data), else "no ticket" / "unknown key"."""
    sealer = c_get_ex_data(c_get_ctx(ssl), c_ex_index)
    if sealer == cython.NULL:
        return -1 if enc else 0
    return cython.cast(TicketSealer, sealer)._on_ticket(ssl, key_name, iv, cipher, mac, enc)
