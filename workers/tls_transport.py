"""What the application protocol above the TLS layer sees: an asyncio transport carrying plaintext, and the
TLS facts it can ask for (``get_extra_info``).

It holds no state of its own: every call goes to its layer (``workers/tls_layer.py``) through the layer's
public methods, so the layer stays the one place that knows the connection's state.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from OpenSSL import SSL

from sentin8 import tls_connection

if TYPE_CHECKING:
    from .tls_layer import TLSLayer


class TLSHandshakeError(ConnectionError):
    """The TLS handshake failed; ``reason`` is the short text also given to ``on_handshake_error``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TLSAppTransport(asyncio.Transport):
    # No super().__init__(): it only stores the ``extra`` mapping that get_extra_info below never reads, and it
    # is interpreted Python, once per connection.
    def __init__(self, layer: TLSLayer) -> None:
        self._layer = layer

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._layer.extra_info(name, default)

    def is_closing(self) -> bool:
        return self._layer.closing

    def close(self) -> None:
        self._layer.close()

    def abort(self) -> None:
        self._layer.abort()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._layer.write(data)

    def write_soon(self, data: bytes | bytearray | memoryview) -> None:
        """``write``, the socket write at the end of this loop turn (``TLSLayer.write_soon``)."""
        self._layer.write_soon(data)

    def writelines(self, list_of_data: Any) -> None:
        self._layer.write(b"".join(list_of_data))

    def write_eof(self) -> None:
        self._layer.write_eof()

    def can_write_eof(self) -> bool:
        return True

    def pause_reading(self) -> None:
        self._layer.pause_reading()

    def resume_reading(self) -> None:
        self._layer.resume_reading()

    def is_reading(self) -> bool:
        return not self._layer.reading_paused and not self._layer.closing

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._layer.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._layer.get_write_buffer_limits()

    def get_write_buffer_size(self) -> int:
        return self._layer.write_buffer_size()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._layer.set_app(protocol)  # type: ignore[arg-type]

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._layer.app  # type: ignore[return-value]


# The extra-info keys a TLS connection answers itself; every other key goes to the raw transport.
TLS_KEYS = frozenset(
    {"sni", "tls_group", "tls_version", "tls_cipher", "peercert", "tls_session", "session_reused", "ssl_object",
     "tls_connection", "alpn"}
)  # fmt: skip


def tls_info(conn: SSL.Connection | tls_connection.RecordIO, name: str, default: Any) -> Any:
    """One of ``TLS_KEYS`` for a live connection (``peercert``: the peer's certificate, DER). ``conn`` is the
    layer's connection: a server side's ``RecordIO`` or a client side's pyOpenSSL ``Connection``; only the
    latter has a ``tls_session`` to resume (a server keeps none of its own)."""
    if name == "sni":
        sni = tls_connection.servername(conn)
        return sni.decode("ascii", "replace") if sni is not None else default
    if name == "tls_group":
        return tls_connection.group_name(conn) or default
    if name == "tls_version":
        return tls_connection.protocol_version(conn)
    if name == "tls_cipher":
        return tls_connection.cipher_name(conn) or default
    if name == "peercert":
        der = tls_connection.peer_certificate_der(conn)
        return der if der is not None else default
    if name == "tls_session":
        return conn.get_session() if isinstance(conn, SSL.Connection) else default
    if name == "session_reused":
        return tls_connection.session_reused(conn)
    if name == "alpn":  # the protocol ALPN chose (b"h2", b"http/1.1"), None without ALPN
        return tls_connection.alpn_selected(conn) or default
    return conn  # ssl_object, tls_connection
