"""An HTTP/2 request's header block → the same ``RequestHead`` HTTP/1.1 produces, sans-IO (RFC 9113 §8).

The exchange must never see the client's wire protocol (DESIGN.md §10), so an h2 request leaves here as the
``RequestHead`` that ``validate_request`` builds for h1, and the admission, WAF, hygiene and upstream code that
follow are the h1 ones. What differs is checked here, and each refusal is an ``H2Refusal`` carrying a counter
name and what to answer: ``STREAM_ERROR`` (RST_STREAM PROTOCOL_ERROR: the RFC's "malformed", for shapes no
HTTP/2 client produces) or an HTTP status answered on the stream (400, 405, 431: well-formed HTTP/2 that this
edge refuses, as h1 answers it). Nothing refused is ever forwarded.

The head it builds:

- ``version`` is ``H2_VERSION`` ("2"). Code that asks ``version == "1.1"`` to mean "not 1.0" (keep-alive,
  interim responses, chunked output) must ask ``version != "1.0"`` instead; ``response_framing`` knows "2".
  "2" is also what ModSecurity turns into ``HTTP/2``, which the CRS lists as an allowed version.
- ``headers`` hold one ``host`` first (from ``:authority``, or the ``host`` field when there is no
  ``:authority``: RFC 9113 §8.3.1), then the regular fields in order, cookie crumbs joined with ``"; "`` into
  one ``cookie`` at the first crumb's place (RFC 9113 §8.2.3), so WAF and hygiene see what h1 shows them.
- ``chunked`` means "a body of undeclared length follows" (no content-length, no END_STREAM on HEADERS): the
  upstream request is then chunked, as nginx does. ``keep_alive`` is True (the stream ends, the connection
  stays); ``websocket`` is False (RFC 8441 is not served).

The engine checks most of these rules too (nghttp2 does); this module does not rely on it, so the adapter
can be replaced and every refusal still has its own reason.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .acme import ACME_PREFIX, NOT_ACME, acme_challenge
from .framing import H2_VERSION, Header, RequestHead, new_request_head, split_host

__all__ = ["H2_VERSION", "REASONS", "STREAM_ERROR", "H2Refusal", "check_body_length", "check_trailers", "map_request"]

STREAM_ERROR = 0  # H2Refusal.status: reset the stream with PROTOCOL_ERROR instead of answering


class H2Refusal(Exception):
    """The request is not forwarded: ``reason`` is the counter, ``status`` 0 (stream error) or the answer."""

    __slots__ = ("reason", "status")

    def __init__(self, reason: str, status: int = STREAM_ERROR) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


# Every reason this module can give, for the counters (each one is a counter name).
REASONS: tuple[str, ...] = (
    "h2_pseudo_unknown",
    "h2_pseudo_duplicate",
    "h2_pseudo_missing",
    "h2_pseudo_after_regular",
    "h2_pseudo_response",
    "h2_pseudo_in_trailers",
    "h2_extended_connect",
    "h2_connect",
    "h2_uppercase_name",
    "h2_bad_name",
    "h2_bad_value",
    "h2_connection_header",
    "h2_bad_te",
    "h2_bad_content_length",
    "h2_content_length_mismatch",
    "h2_bad_method",
    "h2_empty_path",
    "h2_bad_path",
    "h2_scheme_not_https",
    "h2_bad_authority",
    "h2_missing_authority",
    "h2_host_mismatch",
    "h2_duplicate_host",
    "h2_too_many_headers",
)

# RFC 9113 §8.2.2: fields that only make sense on one HTTP/1.1 hop; their presence makes the request malformed.
CONNECTION_SPECIFIC = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"})

# Field checks run over all names (and all values) joined by "\n", in a few C passes (bytes.translate deletes
# every allowed byte: what is left is refused). Names: lower-case tchars (RFC 9110 §5.6.2), ":" only first.
_NAME_BYTES = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
_NAME_BYTES_LF = _NAME_BYTES + b"\n"
_PSEUDO_NAME = re.compile(rb":[!#$%&'*+\-.^_`|~0-9a-z]+")
_SPECIAL = frozenset({b"cookie", b"host", b"content-length", b"te", b"expect"}) | CONNECTION_SPECIFIC
_VALUE_CTL = bytes(c for c in range(32) if c not in (9, 10)) + b"\x7f"  # HTAB allowed; LF is the joiner
_TAB_TO_SP = bytes.maketrans(b"\t", b" ")
_METHOD = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# origin-form ("/" first), visible ASCII only, so the upstream request line can never be split or extended
_VISIBLE_ASCII = bytes(range(0x21, 0x7F))
_COMMON_METHODS = frozenset({b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH"})
_DIGITS = re.compile(rb"[0-9]{1,18}")


def _check_names(joined: bytes, fields: Sequence[Header]) -> None:
    """Regular field names joined by "\n" (at least one): lower-case tchars only (RFC 9113 §8.2.1)."""
    if (
        not joined
        or joined.translate(None, _NAME_BYTES_LF)
        or joined.find(b"\n\n") >= 0  # find(), not `in`: see map_request
        or joined[:1] == b"\n"
        or joined[-1:] == b"\n"
    ):
        for name, _ in fields:
            if not name or name.lower().translate(None, _NAME_BYTES):
                raise H2Refusal("h2_bad_name")
        raise H2Refusal("h2_uppercase_name")
    # (a LF inside one name leaves the joined names well formed: the caller counts the LFs)


def _check_values(fields: Sequence[Header]) -> None:
    """No control character but HTAB, no SP/HTAB at either end (RFC 9113 §8.2.1, RFC 9110 §5.5)."""
    if not fields:
        return
    values = b"\n".join([f[1] for f in fields]).translate(_TAB_TO_SP)
    if (
        len(values.translate(None, _VALUE_CTL)) != len(values)
        or values.count(b"\n") != len(fields) - 1
        or values.find(b" \n") >= 0
        or values.find(b"\n ") >= 0
        or values[:1] == b" "
        or values[-1:] == b" "
    ):
        raise H2Refusal("h2_bad_value")


def _authority_key(value: bytes) -> tuple[str, int] | None:
    """(host, port) an authority names, the https default port filled in; None when it is not a valid one."""
    host = split_host(value)
    if host is None:
        return None
    tail = value[value.rfind(b"]") + 1 :]  # past an IP literal's colons
    colon = tail.rfind(b":")
    return host, int(tail[colon + 1 :]) if colon >= 0 else 443  # split_host let only digits follow a colon


def _join_cookies(out: list[Header], names: list[bytes]) -> None:
    """RFC 9113 §8.2.3: the crumbs become one field, joined with "; ", at the first crumb's place. An empty
    crumb carries no cookie and is left out: joined, it would give the field a trailing or doubled "; ", a value
    ending in a space that RFC 9113 §8.2.1 forbids (and h1 never forwards)."""
    at = j = names.index(b"cookie")
    crumbs = [out[at][1]]
    drop = []
    for _ in range(names.count(b"cookie") - 1):
        j = names.index(b"cookie", j + 1)
        crumbs.append(out[j][1])
        drop.append(j)
    for j in reversed(drop):
        del out[j], names[j]
    out[at] = (b"cookie", b"; ".join([c for c in crumbs if c]))


def map_request(
    fields: Sequence[Header], end_stream: bool, *, max_headers: int, fields_checked: bool = False
) -> RequestHead:
    """The ``RequestHead`` of one decoded request header block, or ``H2Refusal``.

    ``end_stream`` is the HEADERS frame's flag (no body follows); ``max_headers`` is ``policy.max_headers``,
    counted as h1 counts it: the fields forwarded, Host and the joined Cookie included. ``fields_checked``
    says the engine has already refused every name and value that breaks RFC 9113 §8.2.1 exactly as
    ``_check_names``/``_check_values`` would (the adapter says so, and its tests pin it): the character
    checks, most of this function's cost, are then not run twice.
    """
    n = len(fields)
    method = scheme = authority = path = None
    i = 0
    while i < n:  # the pseudo-header fields come first (RFC 9113 §8.3)
        name, value = fields[i]
        if name[:1] != b":":
            break
        i += 1
        if name == b":method":
            if method is not None:
                raise H2Refusal("h2_pseudo_duplicate")
            method = value
        elif name == b":path":
            if path is not None:
                raise H2Refusal("h2_pseudo_duplicate")
            path = value
        elif name == b":scheme":
            if scheme is not None:
                raise H2Refusal("h2_pseudo_duplicate")
            scheme = value
        elif name == b":authority":
            if authority is not None:
                raise H2Refusal("h2_pseudo_duplicate")
            authority = value
        elif name == b":protocol":
            raise H2Refusal("h2_extended_connect")  # RFC 8441 is not served (no ENABLE_CONNECT_PROTOCOL)
        elif name == b":status":
            raise H2Refusal("h2_pseudo_response")
        elif _PSEUDO_NAME.fullmatch(name) is None:
            raise H2Refusal("h2_bad_name")
        else:
            raise H2Refusal("h2_pseudo_unknown")
    out = list(fields[i:]) if i else list(fields)
    names = [f[0] for f in out]
    joined = b"\n".join(names)
    # find(), not `in`: Python 3.11 formats a TypeError inside every `bytes in bytes` (~1k instructions)
    if joined.find(b":") >= 0:  # kept even when the engine checks: a pseudo-header must never go upstream as a field
        for name in names:
            if name[:1] == b":":
                raise H2Refusal("h2_pseudo_after_regular")
        raise H2Refusal("h2_bad_name")
    if not fields_checked:
        if out:
            _check_names(joined, out)
            if joined.count(b"\n") != len(out) - 1:
                raise H2Refusal("h2_bad_name")  # a LF inside a name
        _check_values(fields)
    content_length: int | None = None
    host_value: bytes | None = None
    expect = False
    special = _SPECIAL.intersection(names)  # one C pass; nearly always {} or {b"cookie"}
    if special:
        if not special.isdisjoint(CONNECTION_SPECIFIC):
            raise H2Refusal("h2_connection_header")
        if b"te" in special:
            for name, value in out:
                if name == b"te" and value.lower() != b"trailers":
                    raise H2Refusal("h2_bad_te")
        if b"content-length" in special:
            values = [v for name, v in out if name == b"content-length"]
            if len(values) > 1 or _DIGITS.fullmatch(values[0]) is None:
                raise H2Refusal("h2_bad_content_length")
            content_length = int(values[0])
        if b"host" in special:
            if names.count(b"host") > 1:
                raise H2Refusal("h2_duplicate_host", 400)
            at = names.index(b"host")
            host_value = out[at][1]
            del out[at], names[at]  # one Host upstream: the one from :authority, first
        if b"expect" in special:  # the proxy answers 100 Continue itself when the WAF needs the body first
            expect = any(n == b"expect" and v.strip(b" \t").lower() == b"100-continue" for n, v in out)
        if b"cookie" in special and names.count(b"cookie") > 1:
            _join_cookies(out, names)
    if method is None:
        raise H2Refusal("h2_pseudo_missing")
    if method == b"CONNECT":
        raise H2Refusal("h2_connect", 405)  # as h1 answers CONNECT (RFC 9113 §8.5 needs no :scheme/:path)
    if method not in _COMMON_METHODS and _METHOD.fullmatch(method) is None:
        raise H2Refusal("h2_bad_method")
    if scheme is None or path is None:
        raise H2Refusal("h2_pseudo_missing")
    if not path:
        raise H2Refusal("h2_empty_path")  # RFC 9113 §8.3.1: "MUST NOT be empty"
    if (path[0] != 47 or path.translate(None, _VISIBLE_ASCII)) and (path != b"*" or method != b"OPTIONS"):
        raise H2Refusal("h2_bad_path", 400)
    if scheme != b"https" and scheme.lower() != b"https":
        raise H2Refusal("h2_scheme_not_https", 400)
    if authority is None:
        if host_value is None:
            raise H2Refusal("h2_missing_authority", 400)
        authority = host_value
    host = split_host(authority)
    if host is None:
        raise H2Refusal("h2_bad_authority", 400)
    if host_value is not None and host_value != authority and _authority_key(host_value) != _authority_key(authority):
        raise H2Refusal("h2_host_mismatch", 400)  # RFC 9113 §8.3.1; never forwarded beside it
    out.insert(0, (b"host", authority))
    if len(out) > max_headers:
        raise H2Refusal("h2_too_many_headers", 431)
    if end_stream and content_length:
        raise H2Refusal("h2_content_length_mismatch")  # declares a body, sends none (RFC 9113 §8.1.1)
    return new_request_head(
        method,
        path,
        H2_VERSION,
        out,
        host,
        authority,
        content_length,
        not end_stream and content_length is None,  # undeclared length: chunked upstream
        True,
        False,
        b"",
        acme_challenge(method, path, origin_form=True, body=not end_stream, upgrade=False)
        if path.startswith(ACME_PREFIX)
        else NOT_ACME,  # HTTP-01 challenges take the same bypass as on h1 (acme.py decides what is one)
        expect and not end_stream,  # expect_continue
    )


def check_body_length(declared: int | None, received: int, end_stream: bool) -> None:
    """RFC 9113 §8.1.1: DATA must add up to a declared content-length; call it with the running total after
    every DATA frame (``end_stream`` its flag). Raises ``H2Refusal`` (a stream error) as soon as it cannot."""
    if declared is not None and (received > declared or (end_stream and received != declared)):
        raise H2Refusal("h2_content_length_mismatch")


def check_trailers(fields: Sequence[Header]) -> None:
    """A trailer block: the same field rules, and no pseudo-header (RFC 9113 §8.1). Raises ``H2Refusal``."""
    if not fields:
        return
    names = [f[0] for f in fields]
    joined = b"\n".join(names)
    if joined.find(b":") >= 0:
        raise H2Refusal("h2_pseudo_in_trailers" if any(n[:1] == b":" for n in names) else "h2_bad_name")
    _check_names(joined, fields)
    if joined.count(b"\n") != len(fields) - 1:
        raise H2Refusal("h2_bad_name")
    _check_values(fields)
    special = _SPECIAL.intersection(names)
    if not special.isdisjoint(CONNECTION_SPECIFIC) or any(n == b"te" and v.lower() != b"trailers" for n, v in fields):
        raise H2Refusal("h2_connection_header")
