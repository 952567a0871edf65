"""TLS contexts: the one module that configures pyOpenSSL (ARCHITECTURE.md §5).

The stdlib ``ssl`` module links the system OpenSSL 3.0, which has neither ML-KEM nor ML-DSA, so every context
here is a pyOpenSSL ``SSL.Context`` on the OpenSSL 4 that the ``cryptography`` wheel bundles. The external
side is TLS 1.3 only, key exchange X25519MLKEM768 only, signatures ML-DSA-65 only: a classical-only client
fails the handshake, with no fallback. The two restrictions and the few other calls pyOpenSSL has no public
API for go through ``OpenSSL.SSL._lib`` in this module only.

Per-SNI certificates: the front context's servername callback swaps the connection to a per-certificate
context (``SSL_set_SSL_CTX``, what pyOpenSSL's ``Connection.set_context`` calls). Measured on this machine
with ML-DSA-65: swapping a prebuilt context costs 1.1 µs, ``SSL_use_certificate`` + ``SSL_use_PrivateKey`` on
the connection 2.7 µs (31 µs through pyOpenSSL's public per-connection API, which re-encodes the certificate
each time), against ~1.7 ms for the whole handshake pair; the swap also carries the intermediate chain, which
has no per-connection setter in pyOpenSSL. Session tickets are sealed with the front context's keys, so
resumption works across the swap.

A server-side connection is an SSL object made here (``RecordIO.accepting``), not a pyOpenSSL ``Connection``:
that one is interpreted Python per connection (its constructor, a weak-reference registry to find it from
its callbacks, the servername and ALPN callback wrappers, the error check after every handshake step; ~38k
instructions per resumed connection, callgrind). So the server contexts' callbacks are C callbacks that need
no Python connection object, and none dies with a per-certificate context's Python object, which an SSL object
may outlive (it keeps the ``SSL_CTX`` itself: OpenSSL counts the reference): ALPN's lives as long as the
process, the servername callback as long as the front context that owns it (``FrontContext``; the TLS layer of
every connection holds that context), the ticket callback as long as its ``TicketSealer``. Compiled, they are C
functions OpenSSL calls directly (``_c_on_servername``, ``_c_on_alpn``, ``session_tickets._c_on_ticket``),
with the GIL already held (``RecordIO.handshake`` calls ``SSL_do_handshake`` through a C pointer) and OpenSSL
reached through C pointers; their argument is what the cffi callback's closure held (the ``SNIContexts``, the
served tuple; the sealer is the context's ex_data). Pure, they are cffi callbacks over the same rule
(``SNIContexts.choose``, ``_alpn_choice``, ``TicketSealer._on_ticket``). The client side (upstream TLS, the
probe) keeps pyOpenSSL's ``Connection``: sessions to resume, verification settings, few connections.
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import logging
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from OpenSSL import SSL, crypto
from OpenSSL._util import exception_from_error_queue

try:
    import cython  # the compiled build's RecordIO calls OpenSSL directly (Cython decides it at compile time)
except ImportError:  # a pure install without Cython: every call through cffi

    class cython:  # type: ignore[no-redef]
        compiled = False


from sentin8 import openssl_private
from sentin8.certpair import ServerCert, openssl_reason
from sentin8.certstore import CertStore
from sentin8.key_shares import release_at

if TYPE_CHECKING:
    from sentin8.session_tickets import TicketSealer

log = logging.getLogger(__name__)

PQ_GROUPS = b"X25519MLKEM768"
PQ_SIGALGS = b"mldsa65"
# Same id context on every server context, so a session issued under one SNI context resumes under another.
SESSION_ID_CONTEXT = b"sentin8-proxy"


# ALPN: the application protocols the edge speaks, in its order of preference; with [http2] enabled, h2 first.
SERVED_PROTOCOLS = (b"http/1.1",)
H2_PROTOCOLS = (b"h2", b"http/1.1")


class TLSSetupError(RuntimeError):
    """A context could not be configured as asked (bad file, unsupported group or algorithm, key mismatch).

    ``field``: which of the files given failed (``ca_file``, ``client_cert``, ``client_key``,
    ``client_ca_file``; "" when none); ``reason``: OpenSSL's reasons, readable (``bad base64 decode``)."""

    def __init__(self, message: str, field: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.field = field
        self.reason = reason or message


NO_APPLICATION_PROTOCOL_REASON = "tls: no application protocol"  # the handshake-error reason, as the layer words it


def select_protocol(offered: Sequence[bytes], served: Sequence[bytes] = SERVED_PROTOCOLS) -> bytes | None:
    """The server's ALPN choice: its own most preferred protocol that the client offered, or None."""
    for proto in served:
        if proto in offered:
            return proto
    return None


def _offered_protocols(wire: bytes) -> dict[bytes, int]:
    """The client's ALPN list (RFC 7301 §3.1: length-prefixed names; OpenSSL checked its framing) as each
    name's offset in ``wire``; a name offered twice keeps its first offset."""
    offered: dict[bytes, int] = {}
    pos = 0
    end = len(wire)
    while pos < end:
        size = wire[pos]
        name = wire[pos + 1 : pos + 1 + size]
        if len(name) != size or not size:
            break  # never with OpenSSL's check; a cut name is not offered
        offered.setdefault(name, pos + 1)
        pos += 1 + size
    return offered


def _alpn_choice(wire: bytes, served: tuple[bytes, ...]) -> tuple[int, int] | None:
    """ALPN selection for every server context: the first of the context's protocols (``served``) that the
    client offered (``wire``, its list), as (offset in ``wire``, length): OpenSSL is pointed at the client's own
    copy and copies it at once. None in common: the handshake ends with the ``no_application_protocol`` alert
    and OpenSSL's error "no application protocol" (RFC 7301 §3.2), where "no overlap" (NOACK) would only skip
    ALPN."""
    offered = _offered_protocols(wire)
    chosen = select_protocol(offered, served)
    return None if chosen is None else (offered[chosen], len(chosen))


def _on_alpn(_ssl: object, out: object, outlen: object, wire: object, wire_len: int, arg: object) -> int:
    """The pure build's ALPN callback (cffi; ``arg`` a handle of the served tuple)."""
    choice = _alpn_choice(_ffi.buffer(wire, wire_len)[:], _ffi.from_handle(arg))
    if choice is None:
        return _ALPN_FATAL
    out[0] = wire + choice[0]  # type: ignore[index,operator]
    outlen[0] = choice[1]  # type: ignore[index]
    return _ALPN_OK


def _c_on_alpn(ssl: object, out: object, outlen: object, wire: object, wire_len: int, arg: object) -> int:
    """The compiled build's ALPN callback (``tls.pxd``): OpenSSL calls it with the served tuple's address as
    its argument (``_alpn_lists`` keeps the tuple as long as the process)."""
    try:
        choice = _alpn_choice(cython.cast(cython.p_const_char, wire)[:wire_len], cython.cast(object, arg))
    except Exception:  # refuse rather than guess (the cffi callback's error value)
        log.exception("TLS: ALPN selection failed")
        return _ALPN_FATAL
    if choice is None:
        return _ALPN_FATAL
    offset = cython.declare(cython.Py_ssize_t, choice[0])
    size = cython.declare(cython.uchar, choice[1])
    out[0] = wire + offset
    outlen[0] = size
    return _ALPN_OK


_ALPN_OK = SSL._lib.SSL_TLSEXT_ERR_OK
_ALPN_FATAL = SSL._lib.SSL_TLSEXT_ERR_ALERT_FATAL
_ALPN_CB = "int (*)(SSL *, unsigned char **, unsigned char *, const unsigned char *, unsigned int, void *)"
# One C callback for the process, whatever the context: the served list is its argument (one per distinct
# list, kept as long as the process), so no context's callback dies with its Python object. Compiled, OpenSSL
# calls the C function itself and its argument is the tuple's address; pure, a cffi callback and a handle.
if cython.compiled:
    _ALPN_CALLBACK = SSL._ffi.cast(_ALPN_CB, cython.cast(cython.size_t, cython.cast(cython.p_void, _c_on_alpn)))
else:  # an exception in the callback: refuse rather than guess
    _ALPN_CALLBACK = SSL._ffi.callback(_ALPN_CB, _on_alpn, error=_ALPN_FATAL)
_alpn_lists: dict[tuple[bytes, ...], object] = {}


def select_alpn(ctx: SSL.Context, protocols: Sequence[bytes]) -> None:
    """Make ``ctx`` choose from ``protocols`` (its order of preference) by ALPN."""
    served = tuple(protocols)
    arg = _alpn_lists.get(served)
    if arg is None:  # the key keeps the tuple alive as long as the process: compiled, its address is the argument
        ffi = SSL._ffi
        arg = _alpn_lists[served] = ffi.cast("void *", id(served)) if cython.compiled else ffi.new_handle(served)
    SSL._lib.SSL_CTX_set_alpn_select_cb(ctx._context, _ALPN_CALLBACK, arg)


# -- the calls pyOpenSSL has no public API for ---------------------------------------------------------


def restrict(ctx: SSL.Context, *, groups: bytes | None = None, sigalgs: bytes | None = None) -> None:
    """Limit a context's key-exchange groups and signature algorithms (OpenSSL colon-separated lists)."""
    lib = SSL._lib
    if groups is not None and lib.SSL_CTX_set1_curves_list(ctx._context, groups) != 1:
        lib.ERR_clear_error()  # or a later, unrelated pyOpenSSL call reports this stale error
        raise TLSSetupError(f"OpenSSL refused the group list {groups!r} (this OpenSSL lacks it?)")
    if sigalgs is not None and lib.SSL_CTX_set1_sigalgs_list(ctx._context, sigalgs) != 1:
        lib.ERR_clear_error()
        raise TLSSetupError(f"OpenSSL refused the signature algorithm list {sigalgs!r} (this OpenSSL lacks it?)")


# One NewSessionTicket per handshake instead of OpenSSL's two (RFC 8446 §4.6.1 lets the server choose; nginx
# sends one). Each ticket is a sealing and a record in the server's last handshake step: measured in-process
# (bench/handshake_step.py), dropping the second one cuts that step by about a quarter.
# A client that uses each ticket once still always holds a fresh one: every resumption issues the next
# (``session_tickets`` answers "resume and renew").
TICKETS_PER_HANDSHAKE = 1


@functools.cache
def _num_tickets_setter() -> Callable[[object, int], int] | None:
    """``SSL_CTX_set_num_tickets`` of the bundled OpenSSL (not in pyOpenSSL's bindings), or None."""
    found = openssl_private.resolve(("SSL_CTX_set_num_tickets",))
    if found is None:
        log.warning("TLS: SSL_CTX_set_num_tickets is not reachable; OpenSSL's default of 2 tickets stays")
        return None
    return openssl_private.function(found["SSL_CTX_set_num_tickets"], "int (*)(void *, size_t)")


def set_num_tickets(ctx: SSL.Context, count: int = TICKETS_PER_HANDSHAKE) -> bool:
    """Issue ``count`` session tickets per handshake on this server context; False when the call is unreachable
    (the context keeps OpenSSL's default)."""
    setter = _num_tickets_setter()
    return setter is not None and setter(openssl_private.pointer(ctx._context), count) == 1


def release_idle_buffers(ctx: SSL.Context) -> None:
    """Free a connection's read and write buffers whenever they are empty (``SSL_MODE_RELEASE_BUFFERS``, as
    nginx sets): keep-alive and pooled connections mostly sit idle. Measured with a one-worker fleet and 200
    idle PQ keep-alive connections (bench/idle_memory.py): 69.1 → 36.7 KiB per connection."""
    ctx.set_mode(SSL._lib.SSL_MODE_RELEASE_BUFFERS)


def session_reused(conn: SSL.Connection) -> bool:
    """Whether the handshake resumed a session (a ticket) instead of running a full one."""
    if cython.compiled:
        return c_SSL_session_reused(_ssl_pointer(conn)) != 0
    return bool(SSL._lib.SSL_session_reused(conn._ssl))


# What every new connection asks of its SSL object (its SNI, version, client certificate, ALPN), read straight
# through cffi: pyOpenSSL's getters are interpreted Python, a few of them per connection (this module is
# compiled). Each answers what the pyOpenSSL getter of the same name answers. ``conn`` is whatever holds the
# SSL object as ``_ssl``: a ``RecordIO`` (a server connection) or pyOpenSSL's ``Connection``.


def servername(conn: SSL.Connection) -> bytes | None:
    """The SNI host name the client sent (``get_servername``), None without one."""
    if cython.compiled:
        c_name = c_SSL_get_servername(_ssl_pointer(conn), _HOST_NAME)
        if c_name == cython.NULL:
            return None
        return c_name  # the C string as bytes
    name = _lib.SSL_get_servername(conn._ssl, _HOST_NAME)
    return None if name == _ffi.NULL else _ffi.string(name)


def protocol_version(conn: SSL.Connection) -> str:
    """``"TLSv1.3"`` and the like (``get_protocol_version_name``)."""
    if cython.compiled:
        return c_SSL_get_version(_ssl_pointer(conn)).decode("ascii")
    return _ffi.string(_lib.SSL_get_version(conn._ssl)).decode("ascii")


def _ssl_pointer(conn: object) -> int:
    """Compiled only: the ``SSL *`` of a ``RecordIO`` (its C field) or of a pyOpenSSL ``Connection``."""
    if type(conn) is RecordIO:
        return cython.cast(RecordIO, conn)._c_ssl
    return cython.cast(cython.p_void, _c_address(conn._ssl))  # type: ignore[attr-defined]


def group_name(conn: SSL.Connection | RecordIO) -> str | None:
    """The key exchange group, e.g. ``"X25519MLKEM768"`` (``get_group_name``); None before a session exists."""
    ssl = conn._ssl
    if _lib.SSL_get_session(ssl) == _ffi.NULL:  # SSL_get0_group_name needs an established session
        return None
    name = _lib.SSL_get0_group_name(ssl)
    return None if name == _ffi.NULL else _ffi.string(name).decode("utf-8")


def cipher_name(conn: SSL.Connection | RecordIO) -> str | None:
    """The cipher suite, e.g. ``"TLS_AES_256_GCM_SHA384"`` (``get_cipher_name``); None before one is chosen."""
    cipher = _lib.SSL_get_current_cipher(conn._ssl)
    return None if cipher == _ffi.NULL else _ffi.string(_lib.SSL_CIPHER_get_name(cipher)).decode("utf-8")


def peer_certificate_der(conn: SSL.Connection | RecordIO) -> bytes | None:
    """The certificate the peer presented, DER; None without one."""
    if cython.compiled:  # most clients present none: answered in C
        c_cert = c_SSL_get_peer_certificate(_ssl_pointer(conn))
        if c_cert == cython.NULL:
            return None
        c_X509_free(c_cert)  # a reference; the one below is converted
    cert = _lib.SSL_get_peer_certificate(conn._ssl)
    if cert == _ffi.NULL:
        return None
    bio = _lib.BIO_new(_lib.BIO_s_mem())
    try:
        if bio == _ffi.NULL or _lib.i2d_X509_bio(bio, cert) != 1:
            _lib.ERR_clear_error()
            return None
        data = _ffi.new("char **")
        size = _BIO_get_mem_data(bio, data)
        return _ffi.buffer(data[0], size)[:]
    finally:
        if bio != _ffi.NULL:
            _lib.BIO_free(bio)
        _lib.X509_free(cert)  # SSL_get_peer_certificate gives a reference


def alpn_selected(conn: SSL.Connection) -> bytes | None:
    """The protocol ALPN chose (``get_alpn_proto_negotiated``), None without ALPN."""
    if cython.compiled:
        c_data = cython.declare(cython.p_uchar, cython.NULL)
        c_size = cython.declare(cython.uint, 0)
        c_SSL_get0_alpn_selected(_ssl_pointer(conn), cython.address(c_data), cython.address(c_size))
        if not c_size:
            return None
        return cython.cast(cython.p_char, c_data)[:c_size]
    data = _ffi.new("unsigned char **")
    size = _ffi.new("unsigned int *")
    _lib.SSL_get0_alpn_selected(conn._ssl, data, size)
    return _ffi.buffer(data[0], size[0])[:] if size[0] else None


def verify_peer_name(conn: SSL.Connection, name: str) -> None:
    """Make certificate verification also check that the peer certificate names ``name`` (a DNS name or
    an IP address). Only meaningful on a verifying context; call before the handshake."""
    lib = SSL._lib
    param = lib.SSL_get0_param(conn._ssl)
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        raw = name.encode("idna")
        ok = lib.X509_VERIFY_PARAM_set1_host(param, raw, len(raw))
    else:
        ok = lib.X509_VERIFY_PARAM_set1_ip(param, ip.packed, len(ip.packed))
    if ok != 1:
        lib.ERR_clear_error()
        raise TLSSetupError(f"cannot set the expected peer name {name!r}")


def ssl_error_reason(exc: BaseException) -> str:
    """A short reason from a pyOpenSSL error: the last OpenSSL reason string, e.g. 'no suitable key share'."""
    if isinstance(exc, SSL.Error) and exc.args and isinstance(exc.args[0], list) and exc.args[0]:
        last = exc.args[0][-1]
        if isinstance(last, tuple) and last:
            return f"tls: {last[-1]}"
    return f"tls: {exc.__class__.__name__} {exc}".rstrip()


class RecordIO:
    """The per-record calls of one memory-BIO connection, straight through cffi.

    pyOpenSSL's ``recv``/``send``/``bio_read`` allocate a fresh buffer per call, run ``SSL_get_error`` even
    on success, and report "nothing more" by raising ``WantReadError`` (a traceback per read and per drain):
    measured ~40% of the TLS layer's per-request cost. Here the common outcomes are return values; the rare
    ones (a real error, close_notify) raise pyOpenSSL's own exceptions (``_raise_ssl_error``).

    Server side, it owns its SSL object (``accepting``: no pyOpenSSL ``Connection``, see the module docstring),
    and it is what the TLS layer hands out as the connection. Client side, it runs the records of a pyOpenSSL
    ``Connection`` (``RecordIO(conn)``), which owns the SSL object and keeps the rest of its API.
    """

    __slots__ = ("_fed_big", "_from", "_into", "_owner", "_ssl")

    def __init__(self, conn: SSL.Connection) -> None:
        self._owner: SSL.Connection | None = conn  # frees the SSL object (and its BIOs) when it goes
        self._ssl = conn._ssl
        self._into = conn._into_ssl
        self._from = conn._from_ssl
        self._fed_big = False  # a feed above _RENEW_ABOVE grew the incoming BIO since it was last renewed
        self._point()

    @classmethod
    def accepting(cls, context: SSL.Context) -> RecordIO:
        """A new server-side SSL object of ``context`` over two memory BIOs, in accept state, owned by the
        returned RecordIO (freed with it). What pyOpenSSL's ``Connection(context, None)`` and
        ``set_accept_state`` do, AUTO_RETRY included, without their Python."""
        if cython.compiled:  # the same calls through C pointers: cffi only wraps the three results
            return _accepting_c(cls, context)
        ssl = _lib.SSL_new(context._context)
        if ssl == _ffi.NULL:
            raise exception_from_error_queue(SSL.Error)
        ssl = _ffi.gc(ssl, _lib.SSL_free)
        into = _lib.BIO_new(_lib.BIO_s_mem())
        out = _lib.BIO_new(_lib.BIO_s_mem())
        if into == _ffi.NULL or out == _ffi.NULL:
            for bio in (into, out):
                if bio != _ffi.NULL:
                    _lib.BIO_free(bio)
            raise MemoryError("BIO_new")
        _lib.SSL_set_bio(ssl, into, out)  # the SSL object owns both from here
        _lib.SSL_set_mode(ssl, _lib.SSL_MODE_AUTO_RETRY)
        _lib.SSL_set_accept_state(ssl)
        io = cls.__new__(cls)
        io._owner = None
        io._ssl = ssl
        io._into = into
        io._from = out
        io._fed_big = False
        io._point()
        return io

    def _point(self) -> None:
        """The compiled build's C pointers to the SSL object and its two BIOs, for the per-record calls; the cffi
        objects beside them keep them alive (and free them). Again after each BIO renewal."""
        if cython.compiled:
            self._c_ssl = cython.cast(cython.p_void, _c_address(self._ssl))
            self._c_into = cython.cast(cython.p_void, _c_address(self._into))
            self._c_from = cython.cast(cython.p_void, _c_address(self._from))

    def handshake(self) -> bool:
        """One handshake step: True once complete, False when OpenSSL needs more ciphertext (no
        ``WantReadError`` built per flight). Raises what pyOpenSSL's ``do_handshake`` raises otherwise (its
        check after a success only re-raises what pyOpenSSL's own callback wrappers stored; no context here
        has one)."""
        if cython.compiled:  # the GIL stays held: OpenSSL calls the C callbacks below without a hand-off
            n = c_SSL_do_handshake(self._c_ssl)
            if n <= 0 and c_SSL_get_error(self._c_ssl, n) == _WANT_READ:
                return False
        else:
            n = _lib.SSL_do_handshake(self._ssl)
            if n <= 0 and _SSL_get_error(self._ssl, n) == _WANT_READ:
                return False
        if n <= 0:
            _raise_ssl_error(self._ssl, n)
            raise SSL.Error("SSL_do_handshake failed")
        if cython.compiled:
            release_at(cython.cast(cython.size_t, self._c_ssl))
            buffered = c_BIO_get_mem_data(self._c_into, cython.NULL)
        else:
            release_at(_c_address(self._ssl))
            buffered = _BIO_get_mem_data(self._into, _ffi.NULL)
        if not buffered:
            self._renew_into()  # the handshake's flights (a ~1.6 KB PQ ClientHello) are read: its buffer goes
        return True

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Ciphertext from the peer into the incoming BIO (a memory BIO takes everything). After a feed of more
        than ``_RENEW_ABOVE`` bytes, the next ``read`` that empties the BIO renews it (``_renew_into``)."""
        if cython.compiled and type(data) is bytes:
            raw = cython.declare(bytes, data)  # C types here: tls.pxd cannot give them (no cimport cython)
            n = cython.declare(cython.int, c_BIO_write(self._c_into, cython.cast(cython.p_char, raw), len(raw)))
        else:  # bytes go to cffi as they are; from_buffer (for a bytearray or memoryview) parses keyword arguments
            n = _BIO_write(self._into, data if type(data) is bytes else _from_buffer(data), len(data))
        if n <= 0 and len(data):
            raise exception_from_error_queue(SSL.Error)  # a memory BIO fails only without memory
        if len(data) > _RENEW_ABOVE:
            self._fed_big = True

    def read(self) -> bytes | None:
        """One record's plaintext; None when OpenSSL needs more ciphertext; b"" once the peer's close_notify
        is read (a return value, as ``recv`` says EOF: most connections end so, and pyOpenSSL would build a
        ``ZeroReturnError`` for it). Raises ``SSL.Error`` on failure."""
        if cython.compiled:
            n = cython.declare(cython.int, c_SSL_read(self._c_ssl, c_scratch, _SCRATCH))  # noqa: F821 (tls.pxd)
            if n > 0:
                return c_scratch[:n]  # noqa: F821 (tls.pxd declares it)
            err = cython.declare(cython.int, c_SSL_get_error(self._c_ssl, n))
        else:
            buf = _scratch()
            n = _SSL_read(self._ssl, buf, _SCRATCH)
            if n > 0:
                return _unpack(buf, n)
            err = _SSL_get_error(self._ssl, n)
        if err == _WANT_READ:
            if self._fed_big and not _BIO_get_mem_data(self._into, _ffi.NULL):
                self._renew_into()
            return None
        if err == _ZERO_RETURN:
            return b""
        _raise_ssl_error(self._ssl, n)  # raises (SysCallError, Error)
        raise SSL.Error("SSL_read failed")

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Encrypt into the outgoing BIO; the bytes taken. Raises ``SSL.WantReadError`` mid post-handshake
        message and ``SSL.Error`` on failure."""
        if cython.compiled and type(data) is bytes:
            raw = cython.declare(bytes, data)
            n = cython.declare(cython.int, c_SSL_write(self._c_ssl, cython.cast(cython.p_char, raw), len(raw)))
        else:
            n = _SSL_write(self._ssl, data if type(data) is bytes else _from_buffer(data), len(data))
        if n > 0:
            return n
        _raise_ssl_error(self._ssl, n)
        raise SSL.Error("SSL_write failed")

    def shutdown(self) -> bool:
        """Write our close_notify (``Connection.shutdown``); True once the peer's was read too."""
        n = _lib.SSL_shutdown(self._ssl)
        if n < 0:
            _raise_ssl_error(self._ssl, n)
            raise SSL.Error("SSL_shutdown failed")
        return n > 0

    def drain(self) -> bytes:
        """Everything OpenSSL produced for the peer (b"" when nothing), in one bytes object. After a drain of
        more than ``_RENEW_ABOVE`` bytes the outgoing BIO is replaced by a fresh one (``_renew_out``)."""
        out = self._read_out()  # b"" from an empty memory BIO: nothing to send
        if len(out) < _SCRATCH:
            if len(out) > _RENEW_ABOVE:
                self._renew_out()
            return out
        parts = [out]  # more than one scratch buffer's worth (rare: a big write, a handshake flight)
        while chunk := self._read_out():
            parts.append(chunk)
        self._renew_out()
        return b"".join(parts)

    def _read_out(self) -> bytes:
        """Up to one scratch buffer's worth of the outgoing BIO; b"" when it is empty."""
        if cython.compiled:
            n = cython.declare(cython.int, c_BIO_read(self._c_from, c_scratch, _SCRATCH))  # noqa: F821 (tls.pxd)
            return c_scratch[:n] if n > 0 else b""  # noqa: F821 (tls.pxd declares it)
        buf = _scratch()
        n = _BIO_read(self._from, buf, _SCRATCH)
        return _unpack(buf, n) if n > 0 else b""

    def _renew_out(self) -> None:
        """A fresh, empty outgoing memory BIO in place of the drained one. A memory BIO keeps the largest
        buffer it ever held (OpenSSL's BUF_MEM only grows): the server's PQ handshake flight (ML-DSA-65
        certificate and signature, ~10 KB) left ~13 KiB behind in every connection for its whole life,
        idle or not, a cost nginx (socket BIOs) does not have. ``SSL_set_bio`` with the same read BIO frees
        the old write BIO (OpenSSL keeps its handshake buffering BIO on top, if one is pushed); a pyOpenSSL
        owner's own reference follows, so its ``bio_read`` never sees the freed one."""
        bio = _lib.BIO_new(_lib.BIO_s_mem())
        if bio == _ffi.NULL:
            return  # out of memory: keep the old one, which works
        _lib.SSL_set_bio(self._ssl, self._into, bio)
        self._from = bio
        self._point()
        if self._owner is not None:
            self._owner._from_ssl = bio

    def _renew_into(self) -> None:
        """A fresh incoming memory BIO in place of the emptied one, for the same reason as ``_renew_out``: the
        PQ ClientHello (~1.6 KB, its X25519MLKEM768 share) left ~1.8 KiB in every connection's incoming BIO
        for its life, and a request body read in 64 KiB slices ~85 KiB. Called only when the BIO holds no
        byte: OpenSSL has read everything into its record layer, so nothing is lost. ``SSL_set_bio`` with a new
        read BIO and the same write BIO frees the old read BIO."""
        self._fed_big = False
        bio = _lib.BIO_new(_lib.BIO_s_mem())
        if bio == _ffi.NULL:
            return  # out of memory: keep the old one, which works
        _lib.SSL_set_bio(self._ssl, bio, self._from)
        self._into = bio
        self._point()
        if self._owner is not None:
            self._owner._into_ssl = bio


def _accepting_c(cls: type[RecordIO], context: SSL.Context) -> RecordIO:
    """Compiled only: ``accepting``'s calls through C pointers (``tls.pxd``), one per new connection."""
    c_ssl = c_SSL_new(cython.cast(cython.p_void, _c_address(context._context)))
    if c_ssl == cython.NULL:
        raise exception_from_error_queue(SSL.Error)
    c_into = c_BIO_new(c_mem_method)
    c_out = c_BIO_new(c_mem_method)
    if c_into == cython.NULL or c_out == cython.NULL:
        if c_into != cython.NULL:
            c_BIO_free(c_into)
        if c_out != cython.NULL:
            c_BIO_free(c_out)
        c_SSL_free(c_ssl)
        raise MemoryError("BIO_new")
    c_SSL_set_bio(c_ssl, c_into, c_out)  # the SSL object owns both from here
    c_SSL_set_mode(c_ssl, _lib.SSL_MODE_AUTO_RETRY)
    c_SSL_set_accept_state(c_ssl)
    io = cython.cast(RecordIO, cls.__new__(cls))
    io._owner = None
    io._ssl = _ffi.gc(_ffi.cast("SSL *", cython.cast(cython.size_t, c_ssl)), _lib.SSL_free)
    io._into = _ffi.cast("BIO *", cython.cast(cython.size_t, c_into))
    io._from = _ffi.cast("BIO *", cython.cast(cython.size_t, c_out))
    io._fed_big = False
    io._c_ssl = c_ssl
    io._c_into = c_into
    io._c_from = c_out
    return io


_lib = SSL._lib
_ffi = SSL._ffi
_WANT_READ = SSL._lib.SSL_ERROR_WANT_READ
_ZERO_RETURN = SSL._lib.SSL_ERROR_ZERO_RETURN
_HOST_NAME = SSL._lib.TLSEXT_NAMETYPE_host_name
# RecordIO's per-record calls, bound once: a module global is a cached lookup, an attribute of cffi's lib a
# dictionary lookup per call
_SSL_read, _SSL_write, _SSL_get_error = _lib.SSL_read, _lib.SSL_write, _lib.SSL_get_error
_BIO_read, _BIO_write, _BIO_get_mem_data = _lib.BIO_read, _lib.BIO_write, _lib.BIO_get_mem_data
_from_buffer, _unpack = _ffi.from_buffer, _ffi.unpack  # unpack: the bytes at once, no buffer object first


def _c_address(cdata: object) -> int:
    """The address a cffi pointer holds, or the C function a cffi function calls."""
    return int(_ffi.cast("uintptr_t", cdata))


if cython.compiled:
    # The compiled RecordIO calls OpenSSL's per-record functions through these pointers, the functions cffi's
    # wrappers call: a cffi call hands the GIL off and back and converts each argument, ~900 instructions,
    # 7 times per keep-alive GET (bench/README.md, "s37"). The GIL stays held (a call is a microsecond or
    # so), which also makes one scratch buffer, c_scratch, enough for the process.
    c_SSL_read = cython.cast(_rw_fn, _c_address(_SSL_read))  # noqa: F821 (tls.pxd declares it)
    c_SSL_write = cython.cast(_rw_fn, _c_address(_SSL_write))  # noqa: F821 (tls.pxd declares it)
    c_BIO_read = cython.cast(_rw_fn, _c_address(_BIO_read))  # noqa: F821 (tls.pxd declares it)
    c_BIO_write = cython.cast(_rw_fn, _c_address(_BIO_write))  # noqa: F821 (tls.pxd declares it)
    c_SSL_get_error = cython.cast(_error_fn, _c_address(_SSL_get_error))  # noqa: F821 (tls.pxd declares it)
    # once per handshake step: SSL_do_handshake, and the steps' own calls around it
    c_SSL_do_handshake = cython.cast(_ssl_fn, _c_address(_lib.SSL_do_handshake))  # noqa: F821
    c_BIO_get_mem_data = cython.cast(_mem_data_fn, _c_address(_BIO_get_mem_data))  # noqa: F821
    c_SSL_get_servername = cython.cast(_servername_fn, _c_address(_lib.SSL_get_servername))  # noqa: F821
    c_SSL_set_SSL_CTX = cython.cast(_set_ctx_fn, _c_address(_lib.SSL_set_SSL_CTX))  # noqa: F821
    # what each new connection's bridge asks of it (servername, protocol_version, alpn_selected, ...)
    c_SSL_get_version = cython.cast(_version_fn, _c_address(_lib.SSL_get_version))  # noqa: F821
    c_SSL_session_reused = cython.cast(_ssl_fn, _c_address(_lib.SSL_session_reused))  # noqa: F821
    c_SSL_get0_alpn_selected = cython.cast(_alpn_fn, _c_address(_lib.SSL_get0_alpn_selected))  # noqa: F821
    c_SSL_get_peer_certificate = cython.cast(_peer_cert_fn, _c_address(_lib.SSL_get_peer_certificate))  # noqa: F821
    c_X509_free = cython.cast(_free_fn, _c_address(_lib.X509_free))  # noqa: F821
    # a new server connection's SSL object and its two memory BIOs (RecordIO.accepting)
    c_SSL_new = cython.cast(_peer_cert_fn, _c_address(_lib.SSL_new))  # noqa: F821 (void *(*)(void *))
    c_SSL_free = cython.cast(_free_fn, _c_address(_lib.SSL_free))  # noqa: F821
    c_BIO_new = cython.cast(_peer_cert_fn, _c_address(_lib.BIO_new))  # noqa: F821
    c_BIO_free = cython.cast(_bio_free_fn, _c_address(_lib.BIO_free))  # noqa: F821
    c_mem_method = cython.cast(cython.p_void, _c_address(_lib.BIO_s_mem()))
    c_SSL_set_bio = cython.cast(_set_bio_fn, _c_address(_lib.SSL_set_bio))  # noqa: F821
    c_SSL_set_mode = cython.cast(_set_mode_fn, _c_address(_lib.SSL_set_mode))  # noqa: F821
    c_SSL_set_accept_state = cython.cast(_free_fn, _c_address(_lib.SSL_set_accept_state))  # noqa: F821


def _raise_ssl_error(ssl: object, result: int) -> None:
    """Raise what pyOpenSSL's ``Connection`` raises for the outcome ``result`` of a call on ``ssl``, the same
    classes with the same arguments (it returns only on SSL_ERROR_NONE). Its own check first re-raises an
    exception one of its callback wrappers stored; the contexts here install none (their callbacks are C
    callbacks, verification is by OpenSSL alone), so that part has nothing to do."""
    error = _SSL_get_error(ssl, result)
    if error == _WANT_READ:
        raise SSL.WantReadError()
    if error == _lib.SSL_ERROR_WANT_WRITE:
        raise SSL.WantWriteError()
    if error == _ZERO_RETURN:
        raise SSL.ZeroReturnError()
    if error == _lib.SSL_ERROR_WANT_X509_LOOKUP:
        raise SSL.WantX509LookupError()
    if error == _lib.SSL_ERROR_SYSCALL:
        code = _ffi.errno
        if _lib.ERR_peek_error() == 0 or code != 0:
            if result < 0 and code != 0:
                raise SSL.SysCallError(code, errno.errorcode.get(code))
            raise SSL.SysCallError(-1, "Unexpected EOF")
        raise exception_from_error_queue(SSL.Error)
    if error == _lib.SSL_ERROR_SSL and _lib.ERR_peek_error() != 0:
        # OpenSSL 3 reports a peer gone without close_notify this way; pyOpenSSL keeps calling it a SysCallError
        if _lib.ERR_GET_REASON(_lib.ERR_peek_error()) == _lib.SSL_R_UNEXPECTED_EOF_WHILE_READING:
            _lib.ERR_clear_error()
            raise SSL.SysCallError(-1, "Unexpected EOF")
        raise exception_from_error_queue(SSL.Error)
    if error != _lib.SSL_ERROR_NONE:
        raise exception_from_error_queue(SSL.Error)


_SCRATCH = 65536  # one record is at most 16 KiB of plaintext; output flights can be larger (looped)
_RENEW_ABOVE = 4096  # a drain above this renews the outgoing BIO: small responses keep theirs (~5 KiB at most)
if cython.compiled and cython.sizeof(c_scratch) != _SCRATCH:  # noqa: F821 (tls.pxd declares it)
    raise ImportError("sentin8.tls: tls.pxd's c_scratch is not _SCRATCH bytes")
_local = threading.local()  # cffi releases the GIL in calls: one scratch buffer per thread, copied out at once
# The thread that imported this module (a worker's loop thread: fork keeps it) skips the thread-local lookup,
# ~0.8k instructions a call (callgrind), twice per request. An ident is reused only once its thread is gone,
# so a later thread that inherits it cannot share the buffer with a live one.
_get_ident = threading.get_ident
_home_ident = _get_ident()
_home_buf = _ffi.new("char[]", _SCRATCH)


def _scratch() -> object:
    if _get_ident() == _home_ident:
        return _home_buf
    try:
        return _local.buf
    except AttributeError:
        _local.buf = _ffi.new("char[]", _SCRATCH)
        return _local.buf


def load_private_key(pem: bytes) -> crypto.PKey:
    """Load a private key from PEM. ML-DSA keys have no ``cryptography`` → pyOpenSSL conversion, so PEM is
    the only way in."""
    try:
        return crypto.load_privatekey(crypto.FILETYPE_PEM, pem)
    except crypto.Error as exc:
        raise TLSSetupError(f"private key does not load: {exc}") from None


def _use_private_key(ctx: SSL.Context, key: crypto.PKey) -> None:
    # pyOpenSSL deprecates PKey objects in favour of cryptography keys, but cannot convert ML-DSA keys; this
    # runs once per certificate, never per handshake.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.use_privatekey(key)


# -- builders ------------------------------------------------------------------------------------------


_SERVERNAME_CB = "int (*)(SSL *, int *, void *)"
_CTRL_SET_TLSEXT_SERVERNAME_ARG = 54  # SSL_CTX_set_tlsext_servername_arg is a macro over SSL_CTX_ctrl


@functools.cache
def _ctx_ctrl() -> Callable[[object, int, int, int], int] | None:
    """``SSL_CTX_ctrl`` of the bundled OpenSSL (not in pyOpenSSL's bindings; its last argument an address), or
    None: then the servername callback stays a cffi one."""
    found = openssl_private.resolve(("SSL_CTX_ctrl",))
    if found is None:
        return None
    return openssl_private.function(found["SSL_CTX_ctrl"], "long (*)(void *, int, long, uintptr_t)")


class FrontContext(SSL.Context):
    """The front server context (``SNIContexts.front``), whose servername callback picks each connection's
    certificate. It owns that C callback, as pyOpenSSL's own setters make a context own its callbacks: the
    callback lives exactly as long as the context that calls it (a caller may keep the context alone)."""

    servername_callback: object = None
    servername_arg: object = None

    def install_servername_callback(self, callback: object, arg: object = None) -> None:
        """Install ``callback`` (``_SERVERNAME_CB``: a cffi callback, or a C function cast to that type) and keep
        it alive; ``arg``, the C function's argument (OpenSSL hands it the object's address), lives as long."""
        self.servername_callback = callback
        self.servername_arg = arg
        _lib.SSL_CTX_set_tlsext_servername_callback(self._context, callback)
        if arg is not None:
            _ctx_ctrl()(openssl_private.pointer(self._context), _CTRL_SET_TLSEXT_SERVERNAME_ARG, 0, id(arg))


def _tls13_context(
    groups: bytes | None, sigalgs: bytes | None, context_class: type[SSL.Context] = SSL.Context
) -> SSL.Context:
    ctx = context_class(SSL.TLS_METHOD)
    ctx.set_min_proto_version(SSL.TLS1_3_VERSION)
    ctx.set_max_proto_version(SSL.TLS1_3_VERSION)
    restrict(ctx, groups=groups, sigalgs=sigalgs)
    return ctx


def server_context(
    cert: ServerCert | None = None,
    *,
    groups: bytes = PQ_GROUPS,
    sigalgs: bytes = PQ_SIGALGS,
    client_ca_file: str = "",
    protocols: Sequence[bytes] = SERVED_PROTOCOLS,
    context_class: type[SSL.Context] = SSL.Context,
) -> SSL.Context:
    """A TLS 1.3 server context restricted to ``groups``/``sigalgs`` with session tickets on; ALPN selects
    from ``protocols`` in their order (``H2_PROTOCOLS``: h2 preferred).

    ``cert`` installs a certificate (leaf, chain, key); without one the context is a front context that
    needs a servername callback (see ``SNIContexts``). ``client_ca_file`` asks clients for a certificate and
    verifies it against that CA file when one is sent (optional for the client; an invalid one fails the
    handshake); the layer exposes it as ``peercert``. ``context_class``: ``FrontContext`` for a front context.
    """
    ctx = _tls13_context(groups, sigalgs, context_class)
    # Tickets are on unless OP_NO_TICKET; no compression.
    ctx.set_options(SSL.OP_NO_COMPRESSION | SSL.OP_CIPHER_SERVER_PREFERENCE)
    release_idle_buffers(ctx)
    set_num_tickets(ctx)
    ctx.set_session_id(SESSION_ID_CONTEXT)
    ctx.set_session_cache_mode(SSL.SESS_CACHE_SERVER)
    # ALPN runs after the servername callback has switched contexts: every server context selects.
    select_alpn(ctx, protocols)
    if client_ca_file:
        try:
            ctx.load_verify_locations(client_ca_file)
            ctx.load_client_ca(client_ca_file.encode())
        except SSL.Error as exc:
            raise TLSSetupError(
                f"client CA file {client_ca_file!r}: {exc}", "client_ca_file", openssl_reason(exc)
            ) from None
        ctx.set_verify(SSL.VERIFY_PEER)
    if cert is not None:
        install_certificate(ctx, cert)
    return ctx


def install_certificate(ctx: SSL.Context, cert: ServerCert) -> None:
    """Put ``cert`` (leaf, intermediates, key) on an unused context; raise ``TLSSetupError`` on mismatch."""
    try:
        ctx.use_certificate(cert.leaf)
        for extra in cert.chain[1:]:
            ctx.add_extra_chain_cert(extra)
        _use_private_key(ctx, load_private_key(cert.key_pem))
        ctx.check_privatekey()
    except SSL.Error as exc:
        raise TLSSetupError(f"certificate {cert.name}: {exc}") from None


def client_context(
    *,
    groups: bytes = PQ_GROUPS,
    sigalgs: bytes = PQ_SIGALGS,
    ca_file: str = "",
) -> SSL.Context:
    """A TLS 1.3 client context restricted like the server side (X25519MLKEM768, ML-DSA-65 by default).

    With ``ca_file`` the server's chain is verified against it; without one nothing is verified (the
    connection is encrypted but the peer is not authenticated). Name checks: ``verify_peer_name``.
    """
    ctx = _tls13_context(groups, sigalgs)
    ctx.set_session_cache_mode(SSL.SESS_CACHE_CLIENT)
    _client_verify(ctx, ca_file)
    return ctx


def probe_context(*, ca_file: str | None, alpn: Sequence[bytes] = (b"http/1.1",)) -> SSL.Context:
    """The probe's client context (``sentin8-proxy probe``): what the edge accepts and nothing else (TLS 1.3,
    X25519MLKEM768, ML-DSA-65), offering ``alpn``. ``ca_file``: verify the server's chain against that file;
    ``""``: against the bundled OpenSSL's default trust store (``SSL_CERT_FILE``/``SSL_CERT_DIR`` honoured, as
    curl does); None: no verification (``--insecure``). Name checks: ``verify_peer_name`` per connection."""
    ctx = client_context(ca_file=ca_file or "")
    if ca_file == "":
        ctx.set_default_verify_paths()
        ctx.set_verify(SSL.VERIFY_PEER)
    ctx.set_alpn_protos(list(alpn))
    return ctx


def verify_error(conn: SSL.Connection) -> str | None:
    """Why certificate verification failed on ``conn`` (OpenSSL's words), or None when it did not."""
    code = SSL._lib.SSL_get_verify_result(conn._ssl)
    if code == 0:  # X509_V_OK
        return None
    return SSL._ffi.string(SSL._lib.X509_verify_cert_error_string(code)).decode("ascii", "replace")


def upstream_context(
    *,
    ca_file: str = "",
    client_cert: str = "",
    client_key: str = "",
    pq_only: bool = False,
) -> SSL.Context:
    """Client context for bridge-mode backends (``[upstream]`` in the config).

    - ``ca_file``: the backend's chain is verified against it (handshake fails otherwise). When it is empty
      the backend certificate is NOT verified: traffic is encrypted but anyone who can intercept the internal
      network path could impersonate the backend. Set a CA to authenticate backends.
    - ``client_cert``/``client_key``: PEM chain and key presented to backends that ask (mTLS); the key
      defaults to the cert file (combined PEM).
    - ``pq_only``: restrict to TLS 1.3, X25519MLKEM768 and ML-DSA-65 like the external side. Off by default
      because backends are internal and may run classical TLS (TLS 1.2 or newer); OpenSSL 4's defaults still
      prefer the hybrid group when the backend offers it.
    """
    ctx = SSL.Context(SSL.TLS_METHOD)
    ctx.set_min_proto_version(SSL.TLS1_2_VERSION)
    if pq_only:
        ctx.set_min_proto_version(SSL.TLS1_3_VERSION)
        ctx.set_max_proto_version(SSL.TLS1_3_VERSION)
        restrict(ctx, groups=PQ_GROUPS, sigalgs=PQ_SIGALGS)
    ctx.set_options(SSL.OP_NO_COMPRESSION)
    release_idle_buffers(ctx)  # pooled backend connections sit idle between requests
    ctx.set_session_cache_mode(SSL.SESS_CACHE_CLIENT)
    if client_cert:
        field = "client_cert"
        try:
            ctx.use_certificate_chain_file(client_cert)
            field = "client_key"
            ctx.use_privatekey_file(client_key or client_cert)
            ctx.check_privatekey()
        except SSL.Error as exc:
            raise TLSSetupError(
                f"upstream client certificate {client_cert!r}/{client_key!r}: {exc}", field, openssl_reason(exc)
            ) from None
    elif client_key:
        raise TLSSetupError("upstream.client_key is set without upstream.client_cert")
    _client_verify(ctx, ca_file)
    return ctx


def _client_verify(ctx: SSL.Context, ca_file: str) -> None:
    if not ca_file:
        ctx.set_verify(SSL.VERIFY_NONE)
        return
    try:
        ctx.load_verify_locations(ca_file)
    except SSL.Error as exc:
        raise TLSSetupError(f"CA file {ca_file!r}: {exc}", "ca_file", openssl_reason(exc)) from None
    ctx.set_verify(SSL.VERIFY_PEER)


class SNIContexts:
    """The front server context plus one context per certificate, chosen per SNI from a ``CertStore``.

    ``front`` is what ``TLSServerProtocol`` gets. Its servername callback runs for every ClientHello
    (with or without SNI): store certificate for the name, else the bootstrap certificate. Per-certificate
    contexts are built on first use and dropped with the ``ServerCert`` they were built from, so a renewed
    or hot-swapped file gets a new context and in-flight connections keep the old one (their SSL objects hold
    its ``SSL_CTX``). The callback is a C callback that the front context owns (``FrontContext``): it reads
    the SSL object alone, so it serves a ``RecordIO``'s SSL object and a pyOpenSSL ``Connection``'s alike.
    """

    def __init__(
        self,
        store: CertStore,
        *,
        groups: bytes = PQ_GROUPS,
        sigalgs: bytes = PQ_SIGALGS,
        client_ca_file: str = "",
        tickets: TicketSealer | None = None,
        protocols: Sequence[bytes] = SERVED_PROTOCOLS,
    ) -> None:
        self.store = store
        self.tickets = tickets  # fleet-wide ticket keys; None = this process's own (OpenSSL's default)
        self._opts = {"groups": groups, "sigalgs": sigalgs, "client_ca_file": client_ca_file, "protocols": protocols}
        self._contexts: weakref.WeakKeyDictionary[ServerCert, SSL.Context] = weakref.WeakKeyDictionary()
        # Counters (plain attributes).
        self.selected_store = 0
        self.selected_bootstrap = 0
        self.contexts_built = 0
        self.select_errors = 0
        self._last_error = ""
        self.front = server_context(context_class=FrontContext, **self._opts)  # type: ignore[arg-type]
        if cython.compiled and _ctx_ctrl() is not None:  # OpenSSL calls the C function, this object its argument
            address = cython.cast(cython.size_t, cython.cast(cython.p_void, _c_on_servername))
            self.front.install_servername_callback(_ffi.cast(_SERVERNAME_CB, address), self)  # type: ignore[attr-defined]
        else:  # error=0 (SSL_TLSEXT_ERR_OK) if an exception ever escaped _on_servername (it catches them)
            self.front.install_servername_callback(  # type: ignore[attr-defined]
                _ffi.callback(_SERVERNAME_CB, self._on_servername, error=0)
            )
        if tickets is not None:
            tickets.install(self.front)  # tickets are sealed with the front (session) context's keys

    def context_for(self, cert: ServerCert) -> SSL.Context:
        ctx = self._contexts.get(cert)
        if ctx is None:
            ctx = server_context(cert, **self._opts)  # type: ignore[arg-type]
            if self.tickets is not None:
                self.tickets.install(ctx)  # unused while the front context seals; kept consistent anyway
            self._contexts[cert] = ctx
            self.contexts_built += 1
        return ctx

    def choose(self, name: bytes | None) -> SSL.Context | None:
        """The context for a ClientHello's server name: its certificate's, else the bootstrap certificate's;
        counted. None when selection failed (counted, logged once per distinct failure): the connection keeps
        the certificate-less front context and its handshake fails (and is counted)."""
        try:
            cert = self.store.lookup(name)
            if cert is None:
                cert = self.store.bootstrap()
                self.selected_bootstrap += 1
            else:
                self.selected_store += 1
            return self.context_for(cert)
        except Exception as exc:  # caught here, not by cffi or Cython printing a traceback per handshake
            self.select_errors += 1
            if str(exc) != self._last_error:  # once per distinct failure, not once per handshake
                self._last_error = str(exc)
                log.exception("TLS: certificate selection failed")
            return None

    def _on_servername(self, ssl: object, _alert: object, _arg: object) -> int:
        """The pure build's servername callback (cffi); the compiled build's is ``_c_on_servername``."""
        name = _lib.SSL_get_servername(ssl, _HOST_NAME)
        ctx = self.choose(None if name == _ffi.NULL else _ffi.string(name))
        if ctx is not None:
            _lib.SSL_set_SSL_CTX(ssl, ctx._context)
        return 0  # SSL_TLSEXT_ERR_OK: go on, whatever was selected


def _c_on_servername(ssl: object, _alert: object, arg: object) -> int:
    """The compiled build's servername callback (``tls.pxd``): OpenSSL calls it with the ``SNIContexts`` as its
    argument (its ``FrontContext`` keeps that object alive) and it swaps the connection's context in C."""
    name = c_SSL_get_servername(ssl, _HOST_NAME)
    host = None
    if name != cython.NULL:
        host = name  # the C string as bytes
    ctx = cython.cast(object, arg).choose(host)
    if ctx is not None:
        c_SSL_set_SSL_CTX(ssl, cython.cast(cython.p_void, _c_address(ctx._context)))
    return 0  # SSL_TLSEXT_ERR_OK: go on, whatever was selected
