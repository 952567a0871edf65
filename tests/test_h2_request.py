"""HTTP/2 request mapping, sans-IO: decoded header blocks → the h1 ``RequestHead`` or a counted refusal.

Every RFC 9113 §8 rule is pinned with the exact bytes that break it, both with the module's own character
checks and (where the engine is trusted with them) with ``fields_checked=True``; a hypothesis test feeds
arbitrary blocks and asserts that nothing but ``H2Refusal`` escapes and that what is accepted is safe to
forward as HTTP/1.1.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sentin8.http import h2_request
from sentin8.http.framing import RequestHead
from sentin8.http.h2_request import (
    CONNECTION_SPECIFIC,
    H2_VERSION,
    REASONS,
    STREAM_ERROR,
    H2Refusal,
    check_body_length,
    check_trailers,
    map_request,
)

Fields = list[tuple[bytes, bytes]]

PSEUDO: Fields = [
    (b":method", b"GET"),
    (b":authority", b"www.example.com"),
    (b":scheme", b"https"),
    (b":path", b"/assets/app.js?v=1"),
]
CHROME: Fields = [
    *PSEUDO,
    (b"sec-ch-ua", b'"Chromium";v="124", "Not-A.Brand";v="99"'),
    (b"sec-ch-ua-mobile", b"?0"),
    (b"sec-ch-ua-platform", b'"Linux"'),
    (b"user-agent", b"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0"),
    (b"accept", b"*/*"),
    (b"sec-fetch-site", b"same-origin"),
    (b"sec-fetch-mode", b"no-cors"),
    (b"sec-fetch-dest", b"script"),
    (b"referer", b"https://www.example.com/"),
    (b"accept-encoding", b"gzip, deflate, br, zstd"),
    (b"accept-language", b"en-US,en;q=0.9"),
    (b"cookie", b"a=1"),
    (b"x-requested-with", b"fetch"),
    (b"cookie", b"session=abc"),
    (b"cookie", b"theme=dark"),
    (b"priority", b"u=1"),
]


def ok(fields: Fields, end_stream: bool = True, max_headers: int = 100, **kw: bool) -> RequestHead:
    """Both paths (own checks, engine-checked) must agree on an accepted block."""
    head = map_request(fields, end_stream, max_headers=max_headers)
    again = map_request(tuple(fields), end_stream, max_headers=max_headers, fields_checked=True)
    assert again.headers == head.headers and again.target == head.target
    return head


def refused(fields: Fields, end_stream: bool = True, max_headers: int = 100, *, checked: bool = False) -> H2Refusal:
    with pytest.raises(H2Refusal) as info:
        map_request(fields, end_stream, max_headers=max_headers, fields_checked=checked)
    assert info.value.reason in REASONS
    return info.value


def with_pseudo(name: bytes, value: bytes | None) -> Fields:
    """PSEUDO with ``name`` replaced (None: removed)."""
    out = [(n, v) for n, v in PSEUDO if n != name]
    if value is not None:
        out.insert(0, (name, value))
    return out


# -- what an accepted request becomes ----------------------------------------------------------------


def test_a_browser_request_becomes_the_h1_head():
    head = ok(CHROME)
    assert head.method == b"GET"
    assert head.target == b"/assets/app.js?v=1" and head.path == b"/assets/app.js"
    assert head.version == H2_VERSION == "2"
    assert head.host == "www.example.com" and head.authority == b"www.example.com"
    assert head.headers[0] == (b"host", b"www.example.com")
    assert not any(n.startswith(b":") for n, _ in head.headers)
    assert head.content_length is None and not head.chunked and not head.has_body
    assert head.keep_alive and not head.websocket and head.websocket_key == b""


def test_cookie_crumbs_are_joined_at_the_first_crumbs_place():
    names = [n for n, _ in ok(CHROME).headers]
    assert names.count(b"cookie") == 1
    head = ok(CHROME)
    at = names.index(b"cookie")
    assert head.headers[at] == (b"cookie", b"a=1; session=abc; theme=dark")
    assert names[at + 1] == b"x-requested-with"  # the other fields keep their order
    single = ok([*PSEUDO, (b"cookie", b"only=1")])
    assert single.headers[1] == (b"cookie", b"only=1")


def test_empty_cookie_crumbs_are_left_out_of_the_joined_field():
    # joined as they came, b"GET" and b"" gave b"GET; ": a value ending in a space (RFC 9113 §8.2.1)
    head = ok([*PSEUDO, (b"cookie", b"GET"), (b"cookie", b"")])
    assert [v for n, v in head.headers if n == b"cookie"] == [b"GET"]
    head = ok([*PSEUDO, (b"cookie", b""), (b"cookie", b"a=1"), (b"cookie", b""), (b"cookie", b"b=2")])
    assert [v for n, v in head.headers if n == b"cookie"] == [b"a=1; b=2"]


def test_version_2_is_not_mistaken_for_1_0_by_the_response_framing():
    from sentin8.http.response import response_framing

    f = response_framing(200, [], head_only=False, version=H2_VERSION, keep_alive=True, websocket=False, draining=False)
    assert not f.close_client and not f.chunked_out and f.close_delimited and f.extra == ()
    f = response_framing(
        200,
        [(b"Content-Length", b"5")],
        head_only=False,
        version="2",
        keep_alive=True,
        websocket=False,
        draining=True,
    )
    assert not f.close_client  # draining an h2 connection is a GOAWAY, not a per-response close


@pytest.mark.parametrize(
    ("extra", "end_stream", "length", "chunked"),
    [
        ([], False, None, True),  # a body of undeclared length: chunked upstream
        ([(b"content-length", b"12")], False, 12, False),
        ([(b"content-length", b"0")], False, 0, False),
        ([(b"content-length", b"0")], True, 0, False),
        ([], True, None, False),
    ],
)
def test_body_framing(extra, end_stream, length, chunked):
    head = ok([*PSEUDO, *extra], end_stream)
    assert head.content_length == length and head.chunked is chunked
    assert (b"content-length", b"12") not in head.headers or length == 12


def test_content_length_with_end_stream_on_headers_is_a_mismatch():
    r = refused([*PSEUDO, (b"content-length", b"3")], end_stream=True)
    assert (r.reason, r.status) == ("h2_content_length_mismatch", STREAM_ERROR)


@pytest.mark.parametrize("value", [b"", b"-1", b"+1", b"1 ", b" 1", b"0x10", b"1,1", b"1" * 19, b"\xd9\xa1"])
def test_invalid_content_length(value):
    r = refused([*PSEUDO, (b"content-length", value)], end_stream=False)
    assert r.reason in ("h2_bad_content_length", "h2_bad_value") and r.status == STREAM_ERROR


def test_duplicate_content_length_even_equal_is_refused():
    r = refused([*PSEUDO, (b"content-length", b"5"), (b"content-length", b"5")], end_stream=False)
    assert r.reason == "h2_bad_content_length"


def test_options_asterisk():
    head = ok([(b":method", b"OPTIONS"), (b":scheme", b"https"), (b":authority", b"a.test"), (b":path", b"*")])
    assert head.target == b"*"


# -- :authority and Host ------------------------------------------------------------------------------


def test_authority_plays_host_and_an_agreeing_host_field_gives_one_host():
    head = ok([*PSEUDO, (b"host", b"www.example.com"), (b"accept", b"*/*")])
    assert [h for h in head.headers if h[0] == b"host"] == [(b"host", b"www.example.com")]
    assert head.headers[0][0] == b"host"


@pytest.mark.parametrize(
    ("authority", "host_field"),
    [
        (b"www.example.com", b"WWW.Example.COM"),
        (b"www.example.com", b"www.example.com:443"),
        (b"www.example.com:443", b"www.example.com"),
        (b"www.example.com.", b"www.example.com"),
        (b"[::1]:443", b"[::1]"),
    ],
)
def test_host_fields_that_name_the_same_entity_agree(authority, host_field):
    head = ok([*with_pseudo(b":authority", authority), (b"host", host_field)])
    hosts = [h for h in head.headers if h[0] == b"host"]
    assert hosts == [(b"host", authority)] and head.authority == authority


@pytest.mark.parametrize(
    ("authority", "host_field"),
    [
        (b"www.example.com", b"evil.test"),
        (b"www.example.com", b"www.example.com:8443"),
        (b"www.example.com:8443", b"www.example.com"),
        (b"www.example.com", b"www.example.com.evil.test"),
        (b"www.example.com", b"not a host"),
        (b"www.example.com", b""),
    ],
)
def test_a_host_field_that_disagrees_is_refused_never_forwarded(authority, host_field):
    r = refused([*with_pseudo(b":authority", authority), (b"host", host_field)])
    assert (r.reason, r.status) == ("h2_host_mismatch", 400)


def test_a_host_field_alone_stands_in_for_authority():
    head = ok([*with_pseudo(b":authority", None), (b"accept", b"*/*"), (b"host", b"Shop.Test:443")])
    assert head.host == "shop.test" and head.authority == b"Shop.Test:443"
    assert head.headers == [(b"host", b"Shop.Test:443"), (b"accept", b"*/*")]


def test_no_authority_and_no_host_is_a_400():
    r = refused(with_pseudo(b":authority", None))
    assert (r.reason, r.status) == ("h2_missing_authority", 400)


def test_two_host_fields_are_a_400():
    r = refused([*PSEUDO, (b"host", b"www.example.com"), (b"host", b"www.example.com")])
    assert (r.reason, r.status) == ("h2_duplicate_host", 400)


@pytest.mark.parametrize(
    "authority", [b"", b"user@www.example.com", b"www.example.com:99999", b"a b", b"exa%6dple.com", b"[::1", b"x:"]
)
def test_invalid_authority_is_a_400(authority):
    r = refused(with_pseudo(b":authority", authority))
    assert r.status in (400, STREAM_ERROR)
    assert r.reason in ("h2_bad_authority", "h2_bad_value")


def test_authority_with_port_and_ip_literals():
    assert ok(with_pseudo(b":authority", b"Shop.Test:8443")).host == "shop.test"
    assert ok(with_pseudo(b":authority", b"[2001:db8::1]:443")).host == "2001:db8::1"
    assert ok(with_pseudo(b":authority", b"192.0.2.1")).host == "192.0.2.1"


# -- the other pseudo-headers ---------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", [b"http", b"ftp", b"", b"https2", b"wss"])
def test_scheme_must_be_https(scheme):
    r = refused(with_pseudo(b":scheme", scheme))
    assert (r.reason, r.status) == ("h2_scheme_not_https", 400)


def test_scheme_is_case_insensitive():
    assert ok(with_pseudo(b":scheme", b"HTTPS")).target == b"/assets/app.js?v=1"


@pytest.mark.parametrize(
    "path",
    [b"*", b"index.html", b"https://www.example.com/", b"//", b"/a b", b"/\xc3\xa9", b"/a\tb", b"?q=1"],
)
def test_path_must_be_origin_form_of_visible_ascii(path):
    if path == b"//":
        assert ok(with_pseudo(b":path", path)).target == b"//"
        return
    r = refused(with_pseudo(b":path", path))
    assert r.status == 400 and r.reason == "h2_bad_path"


def test_empty_path_is_malformed():
    r = refused(with_pseudo(b":path", b""))
    assert (r.reason, r.status) == ("h2_empty_path", STREAM_ERROR)


@pytest.mark.parametrize("name", [b":method", b":scheme", b":path"])
def test_missing_pseudo_header_is_malformed(name):
    r = refused(with_pseudo(name, None))
    assert (r.reason, r.status) == ("h2_pseudo_missing", STREAM_ERROR)


def test_an_empty_block_is_malformed():
    assert refused([]).reason == "h2_pseudo_missing"


@pytest.mark.parametrize("name", [b":method", b":scheme", b":path", b":authority"])
def test_duplicate_pseudo_header_is_malformed(name):
    value = dict(PSEUDO)[name]
    r = refused([(name, value), *PSEUDO])
    assert (r.reason, r.status) == ("h2_pseudo_duplicate", STREAM_ERROR)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        (b":status", "h2_pseudo_response"),
        (b":protocol", "h2_extended_connect"),
        (b":foo", "h2_pseudo_unknown"),
        (b":", "h2_bad_name"),
        (b":Method", "h2_bad_name"),
        (b"::path", "h2_bad_name"),
    ],
)
def test_unknown_and_response_pseudo_headers_are_malformed(name, reason):
    for checked in (False, True):
        r = refused([*PSEUDO[:2], (name, b"200"), *PSEUDO[2:]], checked=checked)
        assert (r.reason, r.status) == (reason, STREAM_ERROR)


def test_pseudo_header_after_a_regular_field_is_malformed():
    for checked in (False, True):
        r = refused([*PSEUDO[:3], (b"accept", b"*/*"), PSEUDO[3]], checked=checked)
        assert r.reason == "h2_pseudo_after_regular" and r.status == STREAM_ERROR


def test_connect_is_refused_as_h1_refuses_it():
    r = refused([(b":method", b"CONNECT"), (b":authority", b"www.example.com:443")])
    assert (r.reason, r.status) == ("h2_connect", 405)


def test_extended_connect_is_a_stream_error():
    r = refused([(b":method", b"CONNECT"), (b":protocol", b"websocket"), *PSEUDO[1:]])
    assert (r.reason, r.status) == ("h2_extended_connect", STREAM_ERROR)


@pytest.mark.parametrize("method", [b"G ET", b"GET/", b"G\xc3\xa9T", b"", b"(GET)"])
def test_method_must_be_a_token(method):
    r = refused(with_pseudo(b":method", method))
    assert r.status == STREAM_ERROR and r.reason in ("h2_bad_method", "h2_bad_value")


def test_unusual_token_methods_pass_through():
    assert ok(with_pseudo(b":method", b"PROPFIND")).method == b"PROPFIND"
    assert ok(with_pseudo(b":method", b"get")).method == b"get"  # methods are case-sensitive tokens


# -- field names and values -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", [b"Accept", b"ACCEPT", b"x-Forwarded-For", b"X-Sentin8-Env-Id"])
def test_uppercase_names_are_malformed(name):
    r = refused([*PSEUDO, (name, b"x")])
    assert (r.reason, r.status) == ("h2_uppercase_name", STREAM_ERROR)


@pytest.mark.parametrize(
    "name", [b"", b"a b", b"a\x00b", b"a\rb", b"a\nb", b"a:b", b"a@b", b"\xc3\xa9", b"a\tb", b'a"b', b"(x)", b"a/b"]
)
def test_invalid_name_characters_are_malformed(name):
    r = refused([*PSEUDO, (b"accept", b"*/*"), (name, b"x")])
    assert (r.reason, r.status) == ("h2_bad_name", STREAM_ERROR)


@pytest.mark.parametrize(
    "value",
    [b"a\x00b", b"a\rb", b"a\nb", b"\r\n", b" a", b"a ", b"\ta", b"a\t", b" ", b"a\x01b", b"a\x1fb", b"a\x7fb"],
)
def test_invalid_value_characters_are_malformed(value):
    for where in ([*PSEUDO, (b"x-a", value)], [*PSEUDO, (b"x-a", value), (b"x-b", b"1")]):
        r = refused(where)
        assert (r.reason, r.status) == ("h2_bad_value", STREAM_ERROR)


@pytest.mark.parametrize("name", [b":path", b":authority", b":method", b":scheme"])
def test_pseudo_header_values_obey_the_same_rules(name):
    r = refused([(n, v + b"\r\nx: y" if n == name else v) for n, v in PSEUDO])
    assert r.reason == "h2_bad_value"


def test_values_that_are_valid():
    head = ok([*PSEUDO, (b"x-empty", b""), (b"x-inner", b"a \t b"), (b"x-obs", b"caf\xc3\xa9")])
    assert (b"x-empty", b"") in head.headers and (b"x-obs", b"caf\xc3\xa9") in head.headers


@pytest.mark.parametrize("name", sorted(CONNECTION_SPECIFIC))
def test_connection_specific_fields_are_malformed(name):
    for checked in (False, True):
        r = refused([*PSEUDO, (name, b"close")], checked=checked)
        assert (r.reason, r.status) == ("h2_connection_header", STREAM_ERROR)


@pytest.mark.parametrize("value", [b"gzip", b"trailers, gzip", b"chunked", b""])
def test_te_other_than_trailers_is_malformed(value):
    r = refused([*PSEUDO, (b"te", value)])
    assert (r.reason, r.status) == ("h2_bad_te", STREAM_ERROR)


def test_te_trailers_is_accepted():
    assert (b"te", b"trailers") in ok([*PSEUDO, (b"te", b"trailers")]).headers
    ok([*PSEUDO, (b"te", b"Trailers")])


def test_fields_checked_still_enforces_the_structure():
    """With the engine trusted for characters, every structural rule still holds."""
    for fields, reason in [
        ([*PSEUDO, (b"connection", b"x")], "h2_connection_header"),
        ([*PSEUDO, (b"te", b"gzip")], "h2_bad_te"),
        (with_pseudo(b":scheme", b"http"), "h2_scheme_not_https"),
        ([*PSEUDO, (b"host", b"evil.test")], "h2_host_mismatch"),
        (with_pseudo(b":path", b""), "h2_empty_path"),
    ]:
        assert refused(fields, checked=True).reason == reason


# -- the caps --------------------------------------------------------------------------------------------


def test_max_headers_counts_as_h1_does():
    """Host and the joined Cookie count once each, like the h1 lines they become."""
    fields = [*PSEUDO, *((b"x-h%d" % i, b"v") for i in range(8)), (b"cookie", b"a=1"), (b"cookie", b"b=2")]
    assert len(ok(fields, max_headers=10).headers) == 10  # host + 8 + cookie
    assert refused(fields, max_headers=9).status == 431
    assert refused(fields, max_headers=9).reason == "h2_too_many_headers"


# -- body length and trailers ----------------------------------------------------------------------------


def test_check_body_length():
    check_body_length(None, 10**9, True)
    check_body_length(5, 3, False)
    check_body_length(5, 5, True)
    check_body_length(0, 0, True)
    for declared, received, end in ((5, 6, False), (5, 4, True), (0, 1, False), (5, 0, True)):
        with pytest.raises(H2Refusal) as info:
            check_body_length(declared, received, end)
        assert info.value.reason == "h2_content_length_mismatch" and info.value.status == STREAM_ERROR


def test_check_trailers():
    check_trailers([])
    check_trailers([(b"grpc-status", b"0"), (b"x-checksum", b"abc")])
    for fields, reason in [
        ([(b":status", b"200")], "h2_pseudo_in_trailers"),
        ([(b"x-a", b"1"), (b":path", b"/")], "h2_pseudo_in_trailers"),
        ([(b"X-A", b"1")], "h2_uppercase_name"),
        ([(b"x a", b"1")], "h2_bad_name"),
        ([(b"x-a", b"1\r\n")], "h2_bad_value"),
        ([(b"transfer-encoding", b"chunked")], "h2_connection_header"),
        ([(b"te", b"gzip")], "h2_connection_header"),
    ]:
        with pytest.raises(H2Refusal) as info:
            check_trailers(fields)
        assert info.value.reason == reason


# -- the reasons are a contract --------------------------------------------------------------------------


def test_every_reason_raised_is_listed_and_every_listed_reason_is_raised():
    source = Path(h2_request.__file__).with_name("h2_request.py").read_text()  # the source, compiled or not
    raised = set(re.findall(r'H2Refusal\(\s*"(h2_[a-z_0-9]+)"', source))
    raised |= set(re.findall(r'"(h2_[a-z_0-9]+)" if', source)) | set(re.findall(r'else "(h2_[a-z_0-9]+)"', source))
    assert raised == set(REASONS)
    assert len(set(REASONS)) == len(REASONS)
    assert all(re.fullmatch(r"h2_[a-z0-9_]+", r) for r in REASONS)


# -- fuzz -------------------------------------------------------------------------------------------------

_NAMES = st.sampled_from(
    [
        b":method",
        b":path",
        b":scheme",
        b":authority",
        b":protocol",
        b":status",
        b":x",
        b"host",
        b"cookie",
        b"content-length",
        b"te",
        b"connection",
        b"upgrade",
        b"accept",
        b"Accept",
        b"x-sentin8-env-id",
        b"",
    ]
)
_VALUES = st.sampled_from(
    [
        b"GET",
        b"POST",
        b"CONNECT",
        b"OPTIONS",
        b"/",
        b"*",
        b"/a?b",
        b"https",
        b"http",
        b"www.example.com",
        b"evil.test",
        b"trailers",
        b"5",
        b"0",
        b"x",
        b"",
        b" x",
        b"a\r\nb",
        b"\x00",
    ]
)
_FIELD = st.tuples(st.one_of(_NAMES, st.binary(max_size=6)), st.one_of(_VALUES, st.binary(max_size=8)))


def _safe_to_forward(head: RequestHead) -> None:
    assert head.version == "2" and head.headers[0][0] == b"host"
    assert [n for n, _ in head.headers].count(b"host") == 1
    assert head.target == b"*" or re.fullmatch(rb"/[\x21-\x7e]*", head.target)
    assert head.method.isascii() and b" " not in head.method and head.method != b"CONNECT"
    for name, value in head.headers:
        assert name and not name.startswith(b":") and name == name.lower()
        assert name not in CONNECTION_SPECIFIC
        assert not re.search(rb"[\x00-\x08\x0a-\x1f\x7f]", value)
        assert value == value.strip(b" \t")
        assert not re.search(rb"[\x00-\x20\x7f:]", name)
    assert head.host.isascii()


@settings(max_examples=600, deadline=None)
@given(
    st.lists(_FIELD, max_size=12),
    st.permutations(PSEUDO),
    st.booleans(),
    st.booleans(),
    st.integers(min_value=1, max_value=20),
)
def test_fuzz_nothing_but_h2refusal_escapes(extra, pseudo, mix, end_stream, max_headers):
    fields = list(pseudo) + extra if mix else extra
    try:
        head = map_request(fields, end_stream, max_headers=max_headers)
    except H2Refusal as exc:
        assert exc.reason in REASONS and exc.status in (STREAM_ERROR, 400, 405, 431)
    else:
        _safe_to_forward(head)
        assert len(head.headers) <= max_headers
        # the engine-trusted path accepts exactly the same block the same way
        again = map_request(fields, end_stream, max_headers=max_headers, fields_checked=True)
        assert again.headers == head.headers
    try:
        check_trailers(extra)
    except H2Refusal as exc:
        assert exc.reason in REASONS


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=10), st.binary(max_size=10)), max_size=8))
def test_fuzz_raw_bytes_never_crash(fields):
    try:
        _safe_to_forward(map_request([*PSEUDO, *fields], False, max_headers=50))
    except H2Refusal as exc:
        assert exc.reason in REASONS


# -- the shared steps that follow: hygiene and the WAF see what h1 shows them -------------------------------


def test_hygiene_on_an_h2_head_strips_every_reserved_name_and_injects_once():
    from sentin8.http.headers import RESERVED_NAMES, forward_headers
    from sentin8.routing import Route

    spoof = [(n.lower(), b"spoofed") for n in RESERVED_NAMES] + [(b"x_sentin8_env_id", b"spoofed")]
    head = ok([*PSEUDO, *spoof, (b"x-forwarded-for", b"1.2.3.4"), (b"cookie", b"a=1"), (b"cookie", b"b=2")])
    route = Route(hostname="www.example.com", service="web", env_id="env-1", app_id="app-1", org_id="org-1")
    out, _corr = forward_headers(
        head.headers, route, client_ip="198.18.0.2", proto="https", host=head.authority, hostname=head.host
    )
    lowered = [(n.lower(), v) for n, v in out]
    assert not any(v == b"spoofed" for _, v in lowered)
    for name in (b"x-sentin8-env-id", b"x-sentin8-service", b"x-forwarded-for", b"x-forwarded-host"):
        assert [n for n, _ in lowered].count(name) == 1
    assert (b"x-forwarded-for", b"198.18.0.2") in lowered
    assert [n for n, _ in lowered].count(b"host") == 1 and (b"cookie", b"a=1; b=2") in lowered


@pytest.fixture(scope="module")
def waf():
    from sentin8.waf import WafEngine, WafSettings

    return WafEngine(WafSettings())


def _waf_request(head: RequestHead, body: bytes = b""):
    from sentin8.waf import WafRequest

    return WafRequest(head.method, head.target, head.version, head.headers, head.host, "198.18.0.2", body=body)


def test_the_waf_accepts_version_2_and_a_bodyless_length_free_post(waf):
    """CRS knows HTTP/2 (920430 allowed versions; 920180 exempts h2 POSTs without Content-Length)."""
    get = ok([*PSEUDO, (b"user-agent", b"Mozilla/5.0"), (b"accept", b"*/*"), (b"cookie", b"a=1")])
    assert not waf.inspect(_waf_request(get)).blocked
    post = ok(
        [
            *with_pseudo(b":method", b"POST"),
            (b"user-agent", b"Mozilla/5.0"),
            (b"accept", b"*/*"),
            (b"content-type", b"application/x-www-form-urlencoded"),
        ],
        end_stream=False,
    )
    assert post.chunked and post.content_length is None
    assert not waf.inspect(_waf_request(post, b"name=alice")).blocked


def test_an_attack_in_the_last_cookie_crumb_reaches_the_waf_in_the_one_joined_cookie(waf):
    crumbs = [
        (b"cookie", b"_ga=GA1.1.1"),
        (b"cookie", b"theme=dark"),
        (b"cookie", b"id=1' UNION SELECT password FROM users--"),
    ]
    head = ok([*PSEUDO, (b"user-agent", b"Mozilla/5.0"), (b"accept", b"*/*"), *crumbs])
    cookies = [v for n, v in head.headers if n == b"cookie"]
    assert cookies == [b"_ga=GA1.1.1; theme=dark; id=1' UNION SELECT password FROM users--"]
    verdict = waf.inspect(_waf_request(head))
    assert verdict.blocked and "sqli" in verdict.families
