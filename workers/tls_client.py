"""The client side of the TLS layer, for bridge-mode upstream connections (``workers/l7_context.py``
``UpstreamTLS``): SNI, name verification, session resumption on top of ``workers/tls_layer.py``."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable

from OpenSSL import SSL

from sentin8 import tls, tls_connection

from .tls_layer import TLSLayer


class TLSClientProtocol(TLSLayer):
    """Client side, for bridge-mode upstream connections::

        transport, proto = await loop.create_connection(
            lambda: TLSClientProtocol(ctx, App, server_hostname="api.internal"), host, port)
        await proto.handshake_complete

    ``server_hostname`` is sent as SNI (skipped for IP literals); ``verify_name`` additionally requires the
    peer certificate to name it (only with a verifying context); ``session`` resumes a previous session
    (``get_extra_info("tls_session")`` of an earlier connection).
    """

    _server_side = False

    def __init__(
        self,
        context: SSL.Context,
        app_factory: Callable[[], asyncio.Protocol],
        *,
        server_hostname: str | None = None,
        verify_name: str | None = None,
        session: SSL.Session | None = None,
        handshake_timeout: float | None = 10.0,
        on_handshake_error: Callable[[str], None] | None = None,
        on_handshake_done: Callable[[SSL.Connection], None] | None = None,
    ) -> None:
        super().__init__(
            context,
            app_factory,
            handshake_timeout=handshake_timeout,
            on_handshake_error=on_handshake_error,
            on_handshake_done=on_handshake_done,
        )
        self._server_hostname = server_hostname
        self._verify_name = verify_name
        self._session = session

    def _open(self) -> tuple[SSL.Connection, tls_connection.RecordIO]:
        """A pyOpenSSL ``Connection`` in connect state (SNI, the name to verify, the session to resume)."""
        conn = SSL.Connection(self._context, None)
        conn.set_connect_state()
        if self._server_hostname and not _is_ip(self._server_hostname):
            conn.set_tlsext_host_name(self._server_hostname.encode("idna"))
        if self._verify_name:
            tls.verify_peer_name(conn, self._verify_name)
        if self._session is not None:
            conn.set_session(self._session)
        return conn, tls_connection.RecordIO(conn)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
