"""Header hygiene, sans-IO: the spoofing matrix, injected values, correlation ids, hop-by-hop removal."""

from __future__ import annotations

import base64
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sentin8.http.headers import (
    RESERVED_NAMES,
    correlation_id,
    forward_headers,
    passthrough_headers,
    response_headers,
)
from sentin8.routing import Route

ROUTE = Route(hostname="shop.example.com", service="web", env_id="env-1", app_id="app-1", org_id="org-1")
UUID_ID = re.compile(rb"proxy-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def fwd(headers, route=ROUTE, **kw):
    args = {"client_ip": "203.0.113.7", "proto": "https", "host": b"shop.example.com", "hostname": "shop.example.com"}
    args.update(kw)
    return forward_headers(headers, route, **args)


def as_dict(headers) -> dict[bytes, list[bytes]]:
    out: dict[bytes, list[bytes]] = {}
    for name, value in headers:
        out.setdefault(name.lower(), []).append(value)
    return out


def case_variants(name: bytes) -> list[bytes]:
    alternating = bytes(c ^ 0x20 if chr(c).isalpha() and i % 2 else c for i, c in enumerate(name.lower()))
    return [name, name.lower(), name.upper(), alternating, name.replace(b"-", b"_")]


INJECTED = {
    b"x-sentin8-env-id": b"env-1",
    b"x-sentin8-app-id": b"app-1",
    b"x-sentin8-org-id": b"org-1",
    b"x-sentin8-service": b"web",
    b"x-sentin8-hostname": b"shop.example.com",
    b"x-sentin8-caller-service": b"external",
}


def test_eleven_reserved_names():
    assert len(RESERVED_NAMES) == 11
    assert {n.lower() for n in RESERVED_NAMES} >= set(INJECTED) | {b"x-sentin8-client-cert"}


@pytest.mark.parametrize("name", (*RESERVED_NAMES, b"X-Sentin8-Foo", b"x-sentin8-"), ids=lambda n: n.decode())
@pytest.mark.parametrize("position", ["first", "middle", "last"])
@pytest.mark.parametrize("count", [1, 3])
def test_spoofed_reserved_header_never_survives(name, position, count):
    base = [(b"Host", b"shop.example.com"), (b"Accept", b"*/*"), (b"User-Agent", b"t")]
    for variant in case_variants(name):
        spoof = [(variant, b"evil")] * count
        if position == "first":
            headers = spoof + base
        elif position == "middle":
            headers = base[:1] + spoof + base[1:]
        else:
            headers = base + spoof
        out, _ = fwd(headers)
        assert b"evil" not in [v for _, v in out], variant
        got = as_dict(out)
        for injected, value in INJECTED.items():
            assert got[injected] == [value]
        assert not any(n.lower().replace(b"_", b"-") == b"x-sentin8-foo" for n, _ in out)
        # The passthrough (ACME) strips the same names and injects nothing.
        assert not any(n.lower().replace(b"_", b"-").startswith(b"x-sentin8-") for n, _ in passthrough_headers(headers))


def test_every_reserved_name_at_once_in_every_case():
    headers = [(b"Host", b"shop.example.com")]
    for name in RESERVED_NAMES:
        headers.extend((v, b"evil") for v in case_variants(name))
    out, corr = fwd(headers)
    assert all(v != b"evil" for _, v in out)
    sentin8 = [n for n, _ in out if n.lower().startswith(b"x-sentin8-")]
    assert len(sentin8) == len(set(sentin8)) == 7  # the six of INJECTED + the correlation id
    assert UUID_ID.fullmatch(corr)


header_name = st.sampled_from(
    [b"Host", b"Accept", b"Cookie", b"X-Thing", b"Content-Type"]
    + [v for n in RESERVED_NAMES for v in case_variants(n)]
    + [b"X-Sentin8-Anything", b"x-SENTIN8-z"]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(header_name, st.binary(min_size=0, max_size=8)), max_size=40))
def test_no_client_sentin8_header_survives_any_list(headers):
    out, _ = fwd(headers)
    client_values = {id(v) for n, v in headers if n.lower().replace(b"_", b"-").startswith(b"x-sentin8-")}
    for name, value in out:
        if name.lower().startswith(b"x-sentin8-"):
            assert id(value) not in client_values
    got = as_dict(out)
    for injected, value in INJECTED.items():
        assert got[injected] == [value]
    assert [n for n, _ in out if n.lower().replace(b"_", b"-").startswith(b"x-sentin8-")] == [
        n for n, _ in out if n.startswith(b"X-Sentin8-")
    ]


def test_injected_context_values():
    cert = b"\x30\x82\x01\x00fake-der"
    out, corr = fwd([(b"Host", b"shop.example.com:8443")], host=b"shop.example.com:8443", client_cert=cert)
    got = as_dict(out)
    assert got[b"x-sentin8-correlation-id"] == [corr]
    assert got[b"x-sentin8-client-cert"] == [base64.b64encode(cert)]
    assert got[b"x-forwarded-for"] == [b"203.0.113.7"]
    assert got[b"x-forwarded-proto"] == [b"https"]
    assert got[b"x-forwarded-host"] == [b"shop.example.com:8443"]
    assert got[b"host"] == [b"shop.example.com:8443"]


def test_vertical_service_route_without_tenant_ids():
    out, _ = fwd([], route=Route(hostname="auth.example.com", service="auth"), hostname="auth.example.com")
    got = as_dict(out)
    assert got[b"x-sentin8-service"] == [b"auth"]
    assert got[b"x-sentin8-env-id"] == [b""] and got[b"x-sentin8-app-id"] == [b""]
    assert b"x-sentin8-org-id" not in got


@pytest.mark.parametrize(
    "value",
    [b"a", b"abc-123", b"A.b_c:D-9", b"x" * 128, b"0" * 127 + b":"],
)
def test_correlation_id_kept_when_valid(value):
    assert correlation_id(value) == value
    out, corr = fwd([(b"X-Correlation-Id", value)])
    assert corr == value
    assert as_dict(out)[b"x-correlation-id"] == [value]  # the client's own header passes untouched


@pytest.mark.parametrize("value", [b"abc-123 ", b"abc-123\t", b" abc-123", b"\tabc-123  \t"])
def test_correlation_id_whitespace_is_trimmed_not_replaced(value):
    """OWS around a field value is not part of it (RFC 9110 §5.5): a valid id with a trailing space is kept."""
    assert correlation_id(value) == b"abc-123"
    out, corr = fwd([(b"X-Correlation-Id", value)])
    assert corr == b"abc-123" and as_dict(out)[b"x-sentin8-correlation-id"] == [b"abc-123"]


@pytest.mark.parametrize(
    "value",
    [
        None,
        b"",
        b"x" * 129,
        b"has space",
        b"slash/",
        b"semi;colon",
        b'quote"',
        b"tab\tinside",
        b"caf\xc3\xa9",
        b"a\x00b",
        b"new\nline",
        b"x" * 10000,
    ],
)
def test_correlation_id_replaced_when_invalid(value):
    corr = correlation_id(value)
    assert UUID_ID.fullmatch(corr)
    assert correlation_id(value) != corr  # fresh per request


def test_first_correlation_id_header_wins():
    _, corr = fwd([(b"x-correlation-id", b"first"), (b"X-Correlation-Id", b"second")])
    assert corr == b"first"


def test_forwarding_headers_are_authoritative():
    headers = [
        (b"X-Forwarded-For", b"6.6.6.6, 7.7.7.7"),
        (b"x-forwarded-for", b"8.8.8.8"),
        (b"X-Forwarded-Proto", b"http"),
        (b"X-Forwarded-Host", b"evil.example"),
        (b"X-Forwarded-Port", b"1"),
        (b"X_Forwarded_For", b"9.9.9.9"),
        (b"Forwarded", b"for=6.6.6.6"),
        (b"X-Real-IP", b"6.6.6.6"),
    ]
    out, _ = fwd(headers, client_ip="2001:db8::1")
    got = as_dict(out)
    assert got[b"x-forwarded-for"] == [b"2001:db8::1"]
    assert got[b"x-forwarded-proto"] == [b"https"]
    assert got[b"x-forwarded-host"] == [b"shop.example.com"]
    for gone in (b"x-forwarded-port", b"x_forwarded_for", b"forwarded", b"x-real-ip"):
        assert gone not in got


def test_hop_by_hop_headers_removed():
    headers = [
        (b"Host", b"shop.example.com"),
        (b"Connection", b"keep-alive, X-Custom-Hop, host"),
        (b"connection", b"Upgrade"),
        (b"X-Custom-Hop", b"1"),
        (b"Keep-Alive", b"timeout=5"),
        (b"Proxy-Connection", b"keep-alive"),
        (b"TE", b"trailers"),
        (b"Trailer", b"X-T"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Content-Length", b"5"),
        (b"Upgrade", b"h2c"),
        (b"Proxy-Authorization", b"Basic x"),
        (b"Accept", b"*/*"),
    ]
    got = as_dict(fwd(headers)[0])
    for gone in (
        b"connection",
        b"x-custom-hop",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"content-length",
        b"upgrade",
        b"proxy-authorization",
    ):
        assert gone not in got, gone
    assert got[b"host"] == [b"shop.example.com"]  # "Connection: host" cannot remove the routing header
    assert got[b"accept"] == [b"*/*"]


def test_websocket_upgrade_kept():
    headers = [(b"Connection", b"keep-alive, Upgrade"), (b"Upgrade", b"websocket"), (b"Sec-WebSocket-Key", b"k")]
    got = as_dict(fwd(headers, websocket=True)[0])
    assert got[b"upgrade"] == [b"websocket"]
    assert got[b"connection"] == [b"Upgrade"]
    assert got[b"sec-websocket-key"] == [b"k"]
    got = as_dict(passthrough_headers(headers, websocket=True))
    assert got[b"upgrade"] == [b"websocket"] and got[b"connection"] == [b"Upgrade"]


def test_order_and_unrelated_headers_preserved():
    headers = [(b"Accept", b"a"), (b"X-Sentin8-Env-Id", b"e"), (b"Cookie", b"c=1"), (b"Cookie", b"d=2")]
    out, _ = fwd(headers)
    assert out[:3] == [(b"Accept", b"a"), (b"Cookie", b"c=1"), (b"Cookie", b"d=2")]


def test_response_hop_by_hop_removed():
    headers = [
        (b"Content-Type", b"text/plain"),
        (b"Content-Length", b"3"),
        (b"Connection", b"close, X-Internal"),
        (b"X-Internal", b"1"),
        (b"Keep-Alive", b"timeout=5"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Upgrade", b"h2c"),
        (b"Set-Cookie", b"a=1"),
        (b"Set-Cookie", b"b=2"),
    ]
    out = response_headers(headers)
    assert out == [
        (b"Content-Type", b"text/plain"),
        (b"Content-Length", b"3"),
        (b"Set-Cookie", b"a=1"),
        (b"Set-Cookie", b"b=2"),
    ]
    out = response_headers(
        [(b"Upgrade", b"websocket"), (b"Connection", b"Upgrade"), (b"Sec-WebSocket-Accept", b"x")], upgrade=True
    )
    assert as_dict(out) == {b"sec-websocket-accept": [b"x"], b"connection": [b"Upgrade"], b"upgrade": [b"websocket"]}


def test_generated_ids_are_uuid4_across_batches_and_threads():
    """Ids come in os.urandom batches (``_UUID_BATCH``): each one a version-4 RFC 9562 UUID as uuid.uuid4
    prints it, no two alike across batch boundaries or threads taking ids at once, and every free digit
    random."""
    import threading
    import uuid

    taken: list[list[bytes]] = [[] for _ in range(4)]

    def take(out: list[bytes]) -> None:
        out.extend(correlation_id(None) for _ in range(1000))

    threads = [threading.Thread(target=take, args=(out,)) for out in taken]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [i for out in taken for i in out]
    assert len(set(ids)) == len(ids) == 4000
    for value in ids:
        u = uuid.UUID(value.removeprefix(b"proxy-").decode())
        assert u.version == 4 and u.variant == uuid.RFC_4122 and str(u).encode() == value[6:]
    # the random digits stay random: every hex digit in every free position, the variant's four values
    positions = {at: {v[6 + at] for v in ids} for at in range(36) if at not in (8, 13, 14, 18, 23)}
    assert {at for at, seen in positions.items() if len(seen) < 16} == {19}
    assert positions[19] == set(b"89ab")


# --- issue 16: reserved names leave through no response; 1xx framing; Expect on HTTP/1.0; the WebSocket token ---


@pytest.mark.parametrize(
    "name", [v for n in RESERVED_NAMES for v in case_variants(n)] + [b"X-Sentin8-Anything", b"x-sentin8-"]
)
def test_backend_reserved_response_headers_never_reach_the_client(name):
    headers = [(b"Content-Type", b"text/plain"), (name, b"internal"), (b"X-Powered-By", b"x"), (name, b"again")]
    for kw in ({}, {"interim": True}, {"upgrade": True}):
        out = response_headers(headers, **kw)
        assert (b"Content-Type", b"text/plain") in out and (b"X-Powered-By", b"x") in out
        assert not any(v in (b"internal", b"again") for _, v in out), (name, kw)


def test_interim_and_101_heads_lose_the_framing_headers():
    headers = [
        (b"Link", b"</a.css>; rel=preload"),
        (b"Content-Length", b"5"),
        (b"content-length", b"5"),
        (b"Transfer-Encoding", b"chunked"),
        (b"TRANSFER-ENCODING", b"gzip"),
    ]
    assert response_headers(headers, interim=True) == [(b"Link", b"</a.css>; rel=preload")]
    out = response_headers([*headers, (b"Upgrade", b"websocket"), (b"Sec-WebSocket-Accept", b"x")], upgrade=True)
    assert as_dict(out) == {
        b"link": [b"</a.css>; rel=preload"],
        b"sec-websocket-accept": [b"x"],
        b"connection": [b"Upgrade"],
        b"upgrade": [b"websocket"],
    }
    # a final response keeps its Content-Length (its framing); Transfer-Encoding is re-created by the bridge
    assert response_headers(headers) == headers[:3]


@pytest.mark.parametrize("value", [b"100-continue", b"100-Continue", b"foo", b""])
def test_expect_is_dropped_for_http10_and_kept_for_http11(value):
    headers = [(b"Expect", value), (b"EXPECT", value), (b"X-A", b"1")]
    for http10, want in ((True, []), (False, [value, value])):
        assert as_dict(fwd(headers, http10=http10)[0]).get(b"expect", []) == want
        assert as_dict(passthrough_headers(headers, http10=http10)).get(b"expect", []) == want


def test_a_websocket_upgrade_forwards_only_the_websocket_token():
    headers = [(b"Connection", b"keep-alive, Upgrade"), (b"Upgrade", b"h2c, WebSocket"), (b"Upgrade", b"x")]
    got = as_dict(fwd(headers, websocket=True)[0])
    assert got[b"upgrade"] == [b"websocket"] and got[b"connection"] == [b"Upgrade"]
    got = as_dict(fwd(headers)[0])
    assert b"upgrade" not in got and b"connection" not in got  # not a WebSocket: hop-by-hop, stripped
