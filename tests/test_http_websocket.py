"""WebSocket handshakes through the proxy (sentin8/http/websocket.py), sans-IO: the request check, the 101 check,
and every combination of version, method, Upgrade, Connection, key and body through the parser as the bridge
runs it, against an oracle written from RFC 6455 §4 here rather than from the module."""

from __future__ import annotations

import itertools

import pytest

from sentin8.http.framing import HeadError
from sentin8.http.websocket import (
    has_token,
    list_tokens,
    switch_refusal,
    valid_websocket_key,
    websocket_accept,
    websocket_handshake,
)
from tests.test_http_framing import H, parse

KEY = b"dGhlIHNhbXBsZSBub25jZQ=="
ACCEPT = b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="  # RFC 6455's example answer to KEY


def test_list_tokens():
    assert list_tokens([b"a, B ,c"]) == [b"a", b"b", b"c"]
    assert list_tokens([b"a", b"b"]) == [b"a", b"b"]  # two lines are one list (RFC 9110 §5.3)
    assert list_tokens([b", ,a,,\t b\t,"]) == [b"a", b"b"]  # empty elements do not count
    assert list_tokens([]) == [] and list_tokens([b""]) == []


@pytest.mark.parametrize(
    ("values", "found"),
    [
        ([b"websocket"], True),
        ([b"WebSocket"], True),
        ([b" websocket\t"], True),
        ([b"h2c, websocket"], True),
        ([b"h2c", b"websocket"], True),
        ([b"notwebsocket"], False),
        ([b"websocketx"], False),
        ([b"web socket"], False),
        ([b"websocket/13"], False),  # RFC 6455 asks for the bare token
        ([b"web-socket"], False),
        ([b""], False),
        ([], False),
    ],
)
def test_has_token(values, found):
    assert has_token(values, b"websocket") is found


@pytest.mark.parametrize(
    ("method", "version", "upgrades", "connections", "ok"),
    [
        (b"GET", "1.1", [b"websocket"], [b"Upgrade"], True),
        (b"GET", "1.1", [b"websocket"], [b"keep-alive, Upgrade"], True),
        (b"GET", "1.0", [b"websocket"], [b"Upgrade"], False),  # RFC 9110 §7.8: ignored on HTTP/1.0
        (b"POST", "1.1", [b"websocket"], [b"Upgrade"], False),
        (b"HEAD", "1.1", [b"websocket"], [b"Upgrade"], False),
        (b"GET", "1.1", [b"notwebsocket"], [b"Upgrade"], False),
        (b"GET", "1.1", [b"h2c"], [b"Upgrade"], False),
        (b"GET", "1.1", [b"websocket"], [b"keep-alive"], False),
        (b"GET", "1.1", [b"websocket"], [b"notupgrade"], False),
        (b"GET", "1.1", [b"websocket"], [], False),
        (b"GET", "1.1", [], [b"Upgrade"], False),
    ],
)
def test_websocket_handshake(method, version, upgrades, connections, ok):
    assert websocket_handshake(method, version, upgrades, connections) is ok


def test_keys_and_accept():
    assert valid_websocket_key(KEY)
    for bad in (b"", b"k", KEY[:-1], KEY + b"=", b"dGhlIHNhbXBsZSBub25jZXg=", b"dGhlIHNhbXBsZSBub25jZQ-="):
        assert not valid_websocket_key(bad)
    assert websocket_accept(KEY) == ACCEPT


GOOD_101 = [(b"Upgrade", b"websocket"), (b"Connection", b"Upgrade"), (b"Sec-WebSocket-Accept", ACCEPT)]


@pytest.mark.parametrize(
    ("headers", "refusal"),
    [
        (GOOD_101, None),
        (
            [(b"upgrade", b"WebSocket"), (b"connection", b"keep-alive, upgrade"), (b"sec-websocket-accept", ACCEPT)],
            None,
        ),
        ([(b"Upgrade", b"websocket"), (b"Connection", b"Upgrade"), (b"Sec-WebSocket-Accept", b" %s " % ACCEPT)], None),
        ([(b"Upgrade", b"h2c"), *GOOD_101[1:]], "websocket_bad_upgrade"),
        ([(b"Upgrade", b"websocket, h2c"), *GOOD_101[1:]], "websocket_bad_upgrade"),
        ([(b"Upgrade", b"websocket"), (b"Upgrade", b"websocket"), *GOOD_101[1:]], "websocket_bad_upgrade"),
        ([(b"Upgrade", b"notwebsocket"), *GOOD_101[1:]], "websocket_bad_upgrade"),
        ([(b"Upgrade", b""), *GOOD_101[1:]], "websocket_bad_upgrade"),
        (GOOD_101[1:], "websocket_bad_upgrade"),  # no Upgrade at all
        ([GOOD_101[0], GOOD_101[2]], "websocket_bad_upgrade"),  # no Connection
        ([GOOD_101[0], (b"Connection", b"keep-alive"), GOOD_101[2]], "websocket_bad_upgrade"),
        ([GOOD_101[0], (b"Connection", b"upgradex"), GOOD_101[2]], "websocket_bad_upgrade"),
        (GOOD_101[:2], "websocket_bad_accept"),
        ([*GOOD_101, (b"Sec-WebSocket-Accept", ACCEPT)], "websocket_bad_accept"),
        ([*GOOD_101[:2], (b"Sec-WebSocket-Accept", websocket_accept(b"A" * 22 + b"=="))], "websocket_bad_accept"),
        ([*GOOD_101[:2], (b"Sec-WebSocket-Accept", ACCEPT.lower())], "websocket_bad_accept"),
    ],
)
def test_switch_refusal(headers, refusal):
    assert switch_refusal(headers, KEY) == refusal


# --- the whole class through the parser -------------------------------------------------------------------

UPGRADES: dict[bytes | None, bool] = {  # Upgrade value -> holds the token websocket
    b"websocket": True,
    b"WebSocket": True,
    b"WEBSOCKET": True,
    b"h2c, websocket": True,
    b"websocket, h2c": True,
    b",websocket": True,
    b"notwebsocket": False,
    b"websocketx": False,
    b"web socket": False,
    b"websocket/13": False,
    b"h2c": False,
    b"HTTP/2.0": False,
    None: False,
}
CONNECTIONS: dict[bytes | None, bool] = {  # Connection value -> holds the token upgrade
    b"Upgrade": True,
    b"upgrade": True,
    b"UPGRADE": True,
    b"keep-alive, Upgrade": True,
    b"Upgrade, keep-alive": True,
    b"close": False,
    b"keep-alive": False,
    b"notupgrade": False,
    b"upgradex": False,
    None: False,
}
KEYS = {"valid": b"Sec-WebSocket-Key: %s\r\n" % KEY, "missing": b"", "bad": b"Sec-WebSocket-Key: k\r\n"}
KEYS["twice"] = KEYS["valid"] * 2
BODIES = {
    "none": (b"", b""),
    "length": (b"Content-Length: 2\r\n", b"hi"),
    "chunked": (b"Transfer-Encoding: chunked\r\n", b"2\r\nhi\r\n0\r\n\r\n"),
}


def test_every_upgrade_combination_through_the_parser():
    """A tunnel exactly for: HTTP/1.1 GET, both tokens, one valid key, no body. A 400 for a WebSocket handshake
    with a bad key or a body, and for any upgrade with a body. A plain request for everything else."""
    outcomes: dict[str, int] = {"tunnel": 0, "400": 0, "plain": 0}
    for version, method, (up, up_ok), (conn, conn_ok), (kname, key), (bname, (bhead, body)) in itertools.product(
        (b"1.0", b"1.1"), (b"GET", b"POST", b"HEAD"), UPGRADES.items(), CONNECTIONS.items(), KEYS.items(),
        BODIES.items(),
    ):  # fmt: skip
        if version == b"1.0" and bname == "chunked":
            continue  # Transfer-Encoding on HTTP/1.0 is a 400 of its own (test_http_framing)
        raw = method + b" /ws HTTP/" + version + b"\r\n" + H
        raw += b"Upgrade: %s\r\n" % up if up is not None else b""
        raw += b"Connection: %s\r\n" % conn if conn is not None else b""
        raw += key + bhead + b"\r\n" + body
        parser_upgrade = conn_ok and up is not None  # llhttp: Connection: upgrade and an Upgrade field
        handshake = version == b"1.1" and method == b"GET" and up_ok and conn_ok
        has_body = bname != "none"
        case = f"{version} {method} Upgrade={up} Connection={conn} key={kname} body={bname}"
        if parser_upgrade and (has_body or (handshake and kname != "valid")):
            with pytest.raises(HeadError) as err:
                parse(raw)
            assert err.value.status == 400 and err.value.counter == "upgrade_refused", case
            outcomes["400"] += 1
            continue
        head = parse(raw)
        want = parser_upgrade and handshake
        assert head.websocket is want, case
        assert head.websocket_key == (KEY if want else b""), case
        outcomes["tunnel" if want else "plain"] += 1
    assert outcomes == {"tunnel": 30, "400": 2250, "plain": 5520}  # 6 x 5 tunnels: both token lists
