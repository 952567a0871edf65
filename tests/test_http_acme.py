"""Which requests are ACME HTTP-01 challenges (sentin8/http/acme.py), byte by byte: only what a CA sends.

Every dot-segment, encoding and shape trick of a traversal under the prefix must be NOT_A_CHALLENGE (the
normal path), and every near-miss of the prefix itself NOT_ACME. The same forms are sent over sockets in
tests/test_l7_edge.py and through the fleet in tests/test_fleet_http_edge.py.
"""

from __future__ import annotations

import pytest

from sentin8.http.acme import CHALLENGE, NOT_A_CHALLENGE, NOT_ACME, acme_challenge
from tests.test_http_framing import H, parse

P = b"/.well-known/acme-challenge/"
TOKEN = b"LoqXcYV8q5ONbJQxbmR7SCTNo3tiAXDfowyjxAjEuX0"  # the shape of a real one (43 base64url characters)

# Under the prefix, not a challenge: every traversal and encoding form, and what is not a bare token.
TRAVERSALS: dict[str, bytes] = {
    "dotdot-admin": P + b"../../admin",
    "dotdot": P + b"..",
    "dotdot-slash": P + b"../",
    "dot": P + b".",
    "dot-token": P + b"./" + TOKEN,
    "token-dotdot": P + TOKEN + b"/..",
    "token-dotdot-admin": P + TOKEN + b"/../../admin",
    "token-dot": P + TOKEN + b"/.",
    "pct-2e2e": P + b"%2e%2e/admin",
    "pct-2E2e": P + b"%2E%2e/admin",
    "pct-2E2E": P + b"%2E%2E/admin",
    "pct-dot-mixed": P + b".%2e/admin",
    "pct-2e-single": P + b"%2e/" + TOKEN,
    "pct-double-encoded": P + b"%252e%252e/admin",
    "pct-2f": P + TOKEN + b"%2f..%2fadmin",
    "pct-2F": P + TOKEN + b"%2F..%2Fadmin",
    "dotdot-pct-2f": P + b"..%2fadmin",
    "pct-5c": P + b"..%5cadmin",
    "pct-5C": P + b"..%5Cadmin",
    "backslash": P + b"..\\admin",
    "backslash-token": P + TOKEN + b"\\..\\admin",
    "double-slash-before": P + b"/" + TOKEN,
    "double-slash-after": P + TOKEN + b"//",
    "trailing-slash": P + TOKEN + b"/",
    "param": P + TOKEN + b";x=1",
    "param-dotdot": P + b"..;/admin",
    "fragment": P + TOKEN + b"#frag",
    "empty-query": P + TOKEN + b"?",
    "query": P + TOKEN + b"?q=1",
    "query-sqli": P + b"../../admin?q=1%27%20OR%201=1--",
    "pct-nul": P + TOKEN + b"%00",
    "pct-space": P + TOKEN + b"%20",
    "pct-letter": P + b"%74ok",  # an encoded token character is still not what a CA sends
    "pct-2e-at-end": P + TOKEN + b"%2e",
    "dot-in-token": P + TOKEN + b".txt",
    "dots-in-token": P + TOKEN + b"..",
    "padding": P + TOKEN + b"=",
    "base64-plus": P + b"tok+en",
    "base64-slash": P + b"tok/en",
    "tilde": P + b"~" + TOKEN,
    "pipe": P + b"tok|x",
    "quote": P + b'tok"',
    "angle": P + b"tok<x>",
    "brace": P + b"tok{x}",
    "empty-token": P,
}

# Near misses of the prefix: not under it at all (paths are case-sensitive; nothing is decoded).
NEAR_MISSES: dict[str, bytes] = {
    "upper": b"/.WELL-KNOWN/ACME-CHALLENGE/" + TOKEN,
    "title": b"/.Well-Known/Acme-Challenge/" + TOKEN,
    "mixed": b"/.well-known/ACME-challenge/" + TOKEN,
    "no-trailing-slash": b"/.well-known/acme-challenge",
    "no-dot": b"/well-known/acme-challenge/" + TOKEN,
    "leading-double-slash": b"//.well-known/acme-challenge/" + TOKEN,
    "leading-dot-segment": b"/./.well-known/acme-challenge/" + TOKEN,
    "leading-dotdot": b"/x/../.well-known/acme-challenge/" + TOKEN,
    "pct-dot-prefix": b"/%2ewell-known/acme-challenge/" + TOKEN,
    "pct-slash-in-prefix": b"/.well-known%2facme-challenge/" + TOKEN,
    "pct-slash-after-prefix": b"/.well-known/acme-challenge%2f" + TOKEN,
    "inner-double-slash": b"/.well-known//acme-challenge/" + TOKEN,
    "underscore": b"/.well-known/acme_challenge/" + TOKEN,
}


def classify(method: bytes = b"GET", target: bytes = P + TOKEN, **kw) -> int:
    args = {"origin_form": True, "body": False, "upgrade": False, **kw}
    return acme_challenge(method, target, **args)


@pytest.mark.parametrize("token", [TOKEN, b"a", b"A", b"0", b"-", b"_", b"abc-DEF_123", b"x" * 200])
def test_a_ca_challenge_is_a_challenge(token):
    assert classify(target=P + token) == CHALLENGE
    assert classify(b"HEAD", P + token) == CHALLENGE


@pytest.mark.parametrize("target", TRAVERSALS.values(), ids=TRAVERSALS.keys())
def test_every_traversal_under_the_prefix_is_not_a_challenge(target):
    assert classify(target=target) == NOT_A_CHALLENGE
    assert classify(b"HEAD", target) == NOT_A_CHALLENGE


@pytest.mark.parametrize("target", NEAR_MISSES.values(), ids=NEAR_MISSES.keys())
def test_near_misses_of_the_prefix_are_not_acme(target):
    assert classify(target=target) == NOT_ACME


@pytest.mark.parametrize("method", [b"POST", b"PUT", b"DELETE", b"PATCH", b"OPTIONS", b"TRACE", b"PROPFIND", b"get"])
def test_only_get_and_head(method):
    assert classify(method) == NOT_A_CHALLENGE


def test_no_body_no_upgrade_origin_form_only():
    assert classify(body=True) == NOT_A_CHALLENGE
    assert classify(upgrade=True) == NOT_A_CHALLENGE
    assert classify(origin_form=False) == NOT_A_CHALLENGE


def test_nothing_to_do_with_acme():
    for target in (b"/", b"/index.html", b"/.well-known/security.txt", b"*", b"/acme-challenge/" + TOKEN):
        assert classify(target=target) == NOT_ACME


# --- through the parser, as the bridge sees it (httptools + validate_request) -------------------------------


def head_of(target: bytes, method: bytes = b"GET", extra: bytes = b"", version: bytes = b"1.1"):
    return parse(method + b" " + target + b" HTTP/" + version + b"\r\n" + H + extra + b"\r\n")


def test_parsed_challenge():
    assert head_of(P + TOKEN).acme == CHALLENGE
    assert head_of(P + TOKEN, b"HEAD").acme == CHALLENGE
    assert head_of(P + TOKEN, version=b"1.0").acme == CHALLENGE
    assert head_of(P + TOKEN, extra=b"Content-Length: 0\r\n").acme == CHALLENGE  # no body is no body


@pytest.mark.parametrize("target", TRAVERSALS.values(), ids=TRAVERSALS.keys())
def test_parsed_traversals_are_not_challenges(target):
    assert head_of(target).acme == NOT_A_CHALLENGE


@pytest.mark.parametrize("target", NEAR_MISSES.values(), ids=NEAR_MISSES.keys())
def test_parsed_near_misses_are_not_acme(target):
    assert head_of(target).acme == NOT_ACME


@pytest.mark.parametrize("scheme", [b"http", b"https", b"HTTPS"])
def test_absolute_form_is_not_a_challenge(scheme):
    head = head_of(scheme + b"://shop.example.com" + P + TOKEN)
    assert head.target == P + TOKEN and head.acme == NOT_A_CHALLENGE


@pytest.mark.parametrize(
    "extra",
    [
        b"Content-Length: 1\r\n\r\nx",
        b"Transfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n",
    ],
    ids=["content-length", "chunked"],
)
def test_parsed_challenge_with_a_body_is_not_one(extra):
    head = parse(b"GET " + P + TOKEN + b" HTTP/1.1\r\n" + H + extra + b"\r\n")
    assert head.acme == NOT_A_CHALLENGE


@pytest.mark.parametrize(
    "upgrade",
    [
        b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
        b"Connection: Upgrade\r\nUpgrade: h2c\r\n",
    ],
    ids=["websocket", "h2c"],
)
def test_parsed_challenge_with_an_upgrade_is_not_one(upgrade):
    assert head_of(P + TOKEN, extra=upgrade).acme == NOT_A_CHALLENGE
