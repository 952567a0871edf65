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

A server-side connection is an SSL object without a pyOpenSSL ``Connection`` (``tls_connection.RecordIO``), so the
server contexts' callbacks are C callbacks that need no Python connection object, and none dies with a
per-certificate context's Python object, which an SSL object may outlive (it keeps the ``SSL_CTX`` itself: OpenSSL
counts the reference): ALPN's lives as long as the process, the servername callback as long as the front context
that owns it (``FrontContext``; the TLS layer of every connection holds that context), the ticket callback as long
as its ``TicketSealer``. Compiled, they are C functions OpenSSL calls directly (``_c_on_servername``,
``_c_on_alpn``, ``session_tickets._c_on_ticket``), with the GIL already held
(``tls_connection.RecordIO.handshake`` calls ``SSL_do_handshake`` through a C pointer) and OpenSSL reached through
C pointers; their argument is what the cffi callback's closure held (the ``SNIContexts``, the served tuple; the
sealer is the context's ex_data). Pure, they are cffi callbacks over the same rule (``SNIContexts.choose``,
``_alpn_choice``, ``TicketSealer._on_ticket``). The client side (upstream TLS, the probe) keeps pyOpenSSL's
``Connection``: sessions to resume, verification settings, few connections.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from OpenSSL import SSL, crypto

try:
    import cython  # the compiled build's callbacks call OpenSSL directly (Cython decides it at compile time)
except ImportError:  # a pure install without Cython: every call through cffi

    class cython:  # type: ignore[no-redef]
        compiled = False


from sentin8 import openssl_private
from sentin8.certpair import ServerCert, openssl_reason
from sentin8.certstore import CertStore
from sentin8.tls_connection import c_address

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


_lib = SSL._lib
_ffi = SSL._ffi
_HOST_NAME = SSL._lib.TLSEXT_NAMETYPE_host_name
if cython.compiled:
    # the servername callback's two calls, through the functions cffi's wrappers call
    c_SSL_get_servername = cython.cast(_servername_fn, c_address(_lib.SSL_get_servername))  # noqa: F821
    c_SSL_set_SSL_CTX = cython.cast(_set_ctx_fn, c_address(_lib.SSL_set_SSL_CTX))  # noqa: F821


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
        c_SSL_set_SSL_CTX(ssl, cython.cast(cython.p_void, c_address(ctx._context)))
    return 0  # SSL_TLSEXT_ERR_OK: go on, whatever was selected
