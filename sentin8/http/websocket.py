"""WebSocket opening handshakes through the proxy, sans-IO (RFC 6455 §4).

After a WebSocket 101 the connection becomes a raw tunnel: the proxy stops parsing HTTP on it. So a tunnel
opens only when both sides proved they speak WebSocket; anything looser is how raw HTTP is smuggled past the
proxy's framing (WebSocket smuggling). The request (``websocket_handshake``): ``GET`` on HTTP/1.1, an
``Upgrade`` list holding the token ``websocket`` and a ``Connection`` list holding the token ``upgrade``
(case-insensitive, as list elements: ``notwebsocket`` or ``upgrade-insecure`` are other tokens), then exactly
one valid ``Sec-WebSocket-Key``. Every other upgrade (``h2c``, an HTTP/1.0 one, which RFC 9110 §7.8 says to
ignore, a ``POST``) is served as a plain request, its hop-by-hop ``Upgrade`` stripped. The 101
(``switch_refusal``): ``Upgrade`` exactly ``websocket``, ``Connection`` holding ``upgrade``, and exactly one
``Sec-WebSocket-Accept`` matching the client's key (§4.1, what a client must check before it trusts a 101).
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable

Header = tuple[bytes, bytes]

_WS_KEY = re.compile(rb"[A-Za-z0-9+/]{22}==")
_WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_OWS = b" \t"


def list_tokens(values: Iterable[bytes]) -> list[bytes]:
    """The elements of a list-valued field sent as one or more lines (RFC 9110 §5.3, §5.6.1), lower case,
    surrounding whitespace removed, empty elements dropped (``a, ,b`` is ``[a, b]``)."""
    out: list[bytes] = []
    for value in values:
        for element in value.split(b","):
            element = element.strip(_OWS)
            if element:
                out.append(element.lower())
    return out


def has_token(values: Iterable[bytes], token: bytes) -> bool:
    """Whether the list-valued field ``values`` holds ``token`` (lower case) as one of its elements."""
    return token in list_tokens(values)


def websocket_handshake(method: bytes, version: str, upgrades: list[bytes], connections: list[bytes]) -> bool:
    """Whether a request asks to open a WebSocket (RFC 6455 §4.1): the key is checked after this."""
    return (
        method == b"GET"
        and version == "1.1"
        and has_token(upgrades, b"websocket")
        and has_token(connections, b"upgrade")
    )


def valid_websocket_key(key: bytes) -> bool:
    """A Sec-WebSocket-Key is the base64 of 16 bytes: 22 characters and ``==`` (RFC 6455 §4.1)."""
    return _WS_KEY.fullmatch(key) is not None


def websocket_accept(key: bytes) -> bytes:
    """The Sec-WebSocket-Accept a real WebSocket server answers ``key`` with (RFC 6455 §4.2.2)."""
    return base64.b64encode(hashlib.sha1(key + _WS_GUID).digest())


def switch_refusal(headers: list[Header], key: bytes) -> str | None:
    """None when a backend's 101 proves it switched to WebSocket for ``key``; else the counter naming why
    not (``websocket_bad_upgrade``: Upgrade is not exactly ``websocket`` or Connection lacks ``upgrade``;
    ``websocket_bad_accept``: not exactly one Sec-WebSocket-Accept, or the wrong one)."""
    upgrades: list[bytes] = []
    connections: list[bytes] = []
    accepts: list[bytes] = []
    for name, value in headers:
        n = len(name)
        if n == 7 and name.lower() == b"upgrade":
            upgrades.append(value)
        elif n == 10 and name.lower() == b"connection":
            connections.append(value)
        elif n == 20 and name.lower() == b"sec-websocket-accept":
            accepts.append(value)
    if list_tokens(upgrades) != [b"websocket"] or not has_token(connections, b"upgrade"):
        return "websocket_bad_upgrade"
    if len(accepts) != 1 or accepts[0].strip(_OWS) != websocket_accept(key):
        return "websocket_bad_accept"
    return None
