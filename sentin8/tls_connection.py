"""One server TLS connection: its SSL object over two memory BIOs (``RecordIO``), and what a connection is asked.

A server-side connection is an SSL object made here (``RecordIO.accepting``), not a pyOpenSSL ``Connection``:
that one is interpreted Python per connection (its constructor, a weak-reference registry to find it from
its callbacks, the servername and ALPN callback wrappers, the error check after every handshake step; ~38k
instructions per resumed connection, callgrind). The server contexts' callbacks (``sentin8.tls``) are
therefore C callbacks that need no Python connection object. The compiled build calls OpenSSL's per-record
functions, the handshake step and a new connection's set-up through C pointers (``tls_connection.pxd``), with
the GIL held; the pure build calls the same functions through cffi. The client side (upstream TLS, the probe)
keeps pyOpenSSL's ``Connection`` and runs its records through a ``RecordIO`` too.

The getters answer what pyOpenSSL's getters of the same name answer, for a ``RecordIO`` or a pyOpenSSL
``Connection``, without their interpreted Python.
"""

from __future__ import annotations

import errno
import threading

from OpenSSL import SSL
from OpenSSL._util import exception_from_error_queue

try:
    import cython  # the compiled build's RecordIO calls OpenSSL directly (Cython decides it at compile time)
except ImportError:  # a pure install without Cython: every call through cffi

    class cython:  # type: ignore[no-redef]
        compiled = False


from sentin8.key_shares import release_at

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


def c_address(cdata: object) -> int:
    """The address a cffi pointer holds, or the C function a cffi function calls."""
    return int(_ffi.cast("uintptr_t", cdata))


if cython.compiled:
    # The compiled RecordIO calls OpenSSL's per-record functions through these pointers, the functions cffi's
    # wrappers call: a cffi call hands the GIL off and back and converts each argument, ~900 instructions,
    # 7 times per keep-alive GET (bench/README.md, "s37"). The GIL stays held (a call is a microsecond or
    # so), which also makes one scratch buffer, c_scratch, enough for the process.
    c_SSL_read = cython.cast(_rw_fn, c_address(_SSL_read))  # noqa: F821 (tls_connection.pxd declares it)
    c_SSL_write = cython.cast(_rw_fn, c_address(_SSL_write))  # noqa: F821 (tls_connection.pxd declares it)
    c_BIO_read = cython.cast(_rw_fn, c_address(_BIO_read))  # noqa: F821 (tls_connection.pxd declares it)
    c_BIO_write = cython.cast(_rw_fn, c_address(_BIO_write))  # noqa: F821 (tls_connection.pxd declares it)
    c_SSL_get_error = cython.cast(_error_fn, c_address(_SSL_get_error))  # noqa: F821 (tls_connection.pxd declares it)
    # once per handshake step: SSL_do_handshake, and the steps' own calls around it
    c_SSL_do_handshake = cython.cast(_ssl_fn, c_address(_lib.SSL_do_handshake))  # noqa: F821
    c_BIO_get_mem_data = cython.cast(_mem_data_fn, c_address(_BIO_get_mem_data))  # noqa: F821
    c_SSL_get_servername = cython.cast(_servername_fn, c_address(_lib.SSL_get_servername))  # noqa: F821
    # what each new connection's bridge asks of it (servername, protocol_version, alpn_selected, ...)
    c_SSL_get_version = cython.cast(_version_fn, c_address(_lib.SSL_get_version))  # noqa: F821
    c_SSL_session_reused = cython.cast(_ssl_fn, c_address(_lib.SSL_session_reused))  # noqa: F821
    c_SSL_get0_alpn_selected = cython.cast(_alpn_fn, c_address(_lib.SSL_get0_alpn_selected))  # noqa: F821
    c_SSL_get_peer_certificate = cython.cast(_peer_cert_fn, c_address(_lib.SSL_get_peer_certificate))  # noqa: F821
    c_X509_free = cython.cast(_free_fn, c_address(_lib.X509_free))  # noqa: F821
    # a new server connection's SSL object and its two memory BIOs (RecordIO.accepting)
    c_SSL_new = cython.cast(_peer_cert_fn, c_address(_lib.SSL_new))  # noqa: F821 (void *(*)(void *))
    c_SSL_free = cython.cast(_free_fn, c_address(_lib.SSL_free))  # noqa: F821
    c_BIO_new = cython.cast(_peer_cert_fn, c_address(_lib.BIO_new))  # noqa: F821
    c_BIO_free = cython.cast(_bio_free_fn, c_address(_lib.BIO_free))  # noqa: F821
    c_mem_method = cython.cast(cython.p_void, c_address(_lib.BIO_s_mem()))
    c_SSL_set_bio = cython.cast(_set_bio_fn, c_address(_lib.SSL_set_bio))  # noqa: F821
    c_SSL_set_mode = cython.cast(_set_mode_fn, c_address(_lib.SSL_set_mode))  # noqa: F821
    c_SSL_set_accept_state = cython.cast(_free_fn, c_address(_lib.SSL_set_accept_state))  # noqa: F821


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
if cython.compiled and cython.sizeof(c_scratch) != _SCRATCH:  # noqa: F821 (tls_connection.pxd declares it)
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
            self._c_ssl = cython.cast(cython.p_void, c_address(self._ssl))
            self._c_into = cython.cast(cython.p_void, c_address(self._into))
            self._c_from = cython.cast(cython.p_void, c_address(self._from))

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
            release_at(c_address(self._ssl))
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
                return c_scratch[:n]  # noqa: F821 (tls_connection.pxd declares it)
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
            return c_scratch[:n] if n > 0 else b""  # noqa: F821 (tls_connection.pxd declares it)
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
    """Compiled only: ``accepting``'s calls through C pointers (``tls_connection.pxd``), one per new connection."""
    c_ssl = c_SSL_new(cython.cast(cython.p_void, c_address(context._context)))
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
    return cython.cast(cython.p_void, c_address(conn._ssl))  # type: ignore[attr-defined]


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


def ssl_error_reason(exc: BaseException) -> str:
    """A short reason from a pyOpenSSL error: the last OpenSSL reason string, e.g. 'no suitable key share'."""
    if isinstance(exc, SSL.Error) and exc.args and isinstance(exc.args[0], list) and exc.args[0]:
        last = exc.args[0][-1]
        if isinstance(last, tuple) and last:
            return f"tls: {last[-1]}"
    return f"tls: {exc.__class__.__name__} {exc}".rstrip()
