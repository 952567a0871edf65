"""Header hygiene for forwarded requests and responses. Sans-IO: header lists in, header lists out.

The edge is the first hop (ARCHITECTURE.md §6, "Headers"): no client-supplied ``X-Sentin8-*`` header survives, on any
path, in any case, count or position (nor its ``X_Sentin8_*`` spelling, which CGI-style backends conflate
with it); the authoritative tenant context and ``X-Forwarded-*`` are injected
here. The same names are the platform's internal vocabulary, so a backend's own ``X-Sentin8-*`` response
headers never reach a client either. Hop-by-hop headers (RFC 9110 §7.6.1) never cross the proxy; the bridge
re-creates the framing headers (Content-Length / Transfer-Encoding) itself, and a 1xx loses both. Runs per
request: one pass over bytes, lower-case compares.
"""

from __future__ import annotations

import base64
import os
import re

from sentin8.native import loaded_compiled
from sentin8.routing import Route

_COMPILED = loaded_compiled(__file__)  # compiled, correlation ids are formatted by a C loop (_formatted_ids)

Header = tuple[bytes, bytes]

RESERVED_PREFIX = b"x-sentin8-"

# The reserved names the platform trusts. Every one of them, and any other x-sentin8-*, is stripped.
RESERVED_NAMES: tuple[bytes, ...] = (
    b"X-Sentin8-Env-Id",
    b"X-Sentin8-App-Id",
    b"X-Sentin8-Service",
    b"X-Sentin8-Hostname",
    b"X-Sentin8-Correlation-Id",
    b"X-Sentin8-Caller-Service",
    b"X-Sentin8-Org-Id",
    b"X-Sentin8-Tenant-Id",
    b"X-Sentin8-User-Id",
    b"X-Sentin8-Scopes",
    b"X-Sentin8-Client-Cert",
)

# Request headers dropped on every path: hop-by-hop (RFC 9110 §7.6.1), the framing headers the bridge
# re-creates from the parsed message, and client claims about earlier hops (we are the first hop).
_REQUEST_DROP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"content-length",
        b"forwarded",
        b"proxy-authorization",
    }
)

# HTTP/1.0 requests also lose Expect: RFC 9110 §10.1.1 says to ignore a 1.0 request's expectation, and the
# request goes upstream as HTTP/1.1, where it would mean something.
_REQUEST_DROP_HTTP10 = _REQUEST_DROP | {b"expect"}

_RESPONSE_DROP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"proxy-authenticate",
    }
)
# A 1xx has no body (RFC 9110 §15.2): framing headers on one are a backend's mistake a client may act on.
_INTERIM_DROP = _RESPONSE_DROP | {b"content-length"}

# Connection options that name no header (or name one we must keep: Host carries the routing).
_CONNECTION_OPTIONS = frozenset({b"", b"close", b"keep-alive", b"upgrade", b"host"})
_PLAIN_CONNECTION = frozenset({b"keep-alive", b"Keep-Alive", b"close", b"Close", b"upgrade", b"Upgrade"})
# a backend cannot make the proxy drop the response's own framing by listing it in Connection
_RESPONSE_CONNECTION_OPTIONS = _CONNECTION_OPTIONS | {b"content-length"}


def _listed_in_connection(value: bytes, keep: frozenset[bytes]) -> list[bytes]:
    """Header names a Connection value lists: hop-by-hop too (RFC 9110 §7.6.1), minus the ones we keep."""
    if value in _PLAIN_CONNECTION:  # nearly every message: "keep-alive" or "close", nothing listed
        return []
    return [t for t in (tok.strip(b" \t") for tok in value.lower().split(b",")) if t not in keep]


def _drop_listed(out: list[Header], tokens: list[bytes]) -> list[Header]:
    # rare (clients and backends seldom list extra names), so a second pass only when they do
    if not tokens:
        return out
    drop = frozenset(tokens)
    return [h for h in out if h[0].lower() not in drop]


_CORRELATION_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")


def correlation_id(client_value: bytes | None) -> bytes:
    """The client's ``X-Correlation-Id`` when it is 1-128 chars of ``[A-Za-z0-9._:-]``, else ``proxy-<uuid4>``.

    Surrounding whitespace is not part of a field value (RFC 9110 §5.5, OWS), so it is trimmed before the check.
    """
    if client_value is not None:
        value = client_value.strip(b" \t")
        if _CORRELATION_ID.fullmatch(value):
            return value
    return b"proxy-" + _uuid4()


_UUID_BATCH = 256  # ids per os.urandom (the pure formatter: ~200 ns an id; 64 -> 280 ns, 1024 -> 198 ns)
_ready_ids: list[bytes] = []  # formatted ids from one os.urandom batch, taken with list.pop


def _uuid4() -> bytes:
    """A random (version 4, RFC 9562) UUID as lower-case hex with dashes, like ``str(uuid.uuid4())``.

    The same 122 random bits from the OS CSPRNG as ``uuid.uuid4``, without its per-call syscall and the UUID
    object: ``_UUID_BATCH`` ids are made from one ``os.urandom`` at once. ``list.pop`` is atomic, so no two
    threads can take the same id (two threads refilling at once just make two batches)."""
    try:
        return _ready_ids.pop()
    except IndexError:
        _ready_ids.extend(_uuid4_batch())
        return _ready_ids.pop()


# The batch's layout: 37 bytes per id (36 of the UUID, then a space for ``split``). Hex digit j of an id's 32
# lands at _AT[j] (a dash after digits 8, 12, 16 and 20); digit 12 is the version ("4"), digit 16 the variant's
# (10xx: one of "89ab", made from a random digit by _VARIANT_DIGIT, which keeps its two low bits).
_STRIDE = 37
_AT = [j + (j >= 8) + (j >= 12) + (j >= 16) + (j >= 20) for j in range(32)]
_RANDOM_DIGITS = [(j, _AT[j]) for j in range(32) if j not in (12, 16)]
_TEMPLATE = (b"-" * 36 + b" ") * _UUID_BATCH
_VERSION_DIGITS = b"4" * _UUID_BATCH
_VARIANT_DIGIT = bytes.maketrans(b"0123456789abcdef", b"89ab" * 4)


def _uuid4_batch() -> list[bytes]:
    """``_UUID_BATCH`` ids from one ``os.urandom``. Compiled, one C loop writes each id's digits (~0.3k
    instructions an id, where the strided copies below cost ~3k: ``bench.profile.keepalive``, callgrind).
    Pure, formatted column by column: each hex digit position is one strided copy across the whole batch
    (32 C-level copies for all the ids, where slicing and joining each id cost ~0.7 us apiece). Then one
    ``split``."""
    random = os.urandom(16 * _UUID_BATCH)
    if _COMPILED:
        return _formatted_ids(random).split()
    h = random.hex().encode()
    out = bytearray(_TEMPLATE)
    cols = memoryview(out)  # strided stores through a view: Cython compiles a bytearray's own as a type error
    for j, at in _RANDOM_DIGITS:
        cols[at::_STRIDE] = h[j::32]
    cols[_AT[12] :: _STRIDE] = _VERSION_DIGITS
    cols[_AT[16] :: _STRIDE] = h[16::32].translate(_VARIANT_DIGIT)
    cols.release()
    return bytes(out).split()


def _formatted_ids(random: bytes) -> bytes:
    """Compiled only (the C names are headers.pxd's): 16 random bytes an id, as ``_TEMPLATE``'s layout holds
    it; the version nibble set to 4 and the variant's top bits to 10, as uuid.uuid4 sets them."""
    stride, count = _STRIDE, _UUID_BATCH  # C ints compiled
    ids = _new_bytes(stride * count)  # noqa: F821 (uninitialised: every byte is written below)
    dst = PyBytes_AS_STRING(ids)  # noqa: F821
    src = PyBytes_AS_STRING(random)  # noqa: F821
    for k in range(count):
        at = 0
        for j in range(16):
            b = src[16 * k + j] & 0xFF  # a C char may be signed
            if j == 6:
                b = (b & 0x0F) | 0x40
            elif j == 8:
                b = (b & 0x3F) | 0x80
            if j == 4 or j == 6 or j == 8 or j == 10:
                dst[at] = 45  # "-"
                at += 1
            digit = b >> 4
            dst[at] = digit + 48 if digit < 10 else digit + 87
            digit = b & 0x0F
            dst[at + 1] = digit + 48 if digit < 10 else digit + 87
            at += 2
        dst[at] = 32  # the space split() cuts at
        dst += stride
    return ids


def _filter_request(headers: list[Header], websocket: bool, http10: bool) -> tuple[list[Header], bytes | None]:
    """One pass: drop reserved, hop-by-hop, framing and forwarding headers; remember X-Correlation-Id."""
    out: list[Header] = []
    corr: bytes | None = None
    tokens: list[bytes] = []
    drop = _REQUEST_DROP_HTTP10 if http10 else _REQUEST_DROP
    for header in headers:
        name = header[0]  # bytes, typed in headers.pxd: lower(), find() and replace() are C calls, not lookups
        low = name.lower()
        if low.startswith(b"x"):  # startswith, not a slice: on the typed name a C compare, no new bytes
            # "_" too: CGI/WSGI backends read X_Sentin8_Env_Id and X-Sentin8-Env-Id as one name.
            # find(), not `in`: Python 3.11 formats a TypeError inside every `bytes in bytes` (~1k instructions)
            norm = low.replace(b"_", b"-") if low.find(b"_") >= 0 else low
            if norm.startswith(RESERVED_PREFIX) or norm.startswith(b"x-forwarded-") or norm == b"x-real-ip":
                continue
            if low == b"x-correlation-id" and corr is None:
                corr = header[1]
            out.append(header)
        elif low in drop:
            if low == b"connection":
                tokens += _listed_in_connection(header[1], _CONNECTION_OPTIONS)
        else:
            out.append(header)
    out = _drop_listed(out, tokens)
    if websocket:
        # Only the protocol the tunnel is checked for goes upstream (websocket.py), whatever else was listed.
        out.append((b"Connection", b"Upgrade"))
        out.append((b"Upgrade", b"websocket"))
    return out, corr


def forward_headers(
    headers: list[Header],
    route: Route,
    *,
    client_ip: str,
    proto: str,
    host: bytes,
    hostname: str,
    websocket: bool = False,
    client_cert: bytes | None = None,
    http10: bool = False,
) -> tuple[list[Header], bytes]:
    """The header list to send upstream for a routed request, and its correlation id.

    ``host`` is the Host value as received (for X-Forwarded-Host), ``hostname`` the name it resolved
    (lower case, no port). ``client_cert`` is the verified client certificate (DER), when there is one;
    ``http10``: the client spoke HTTP/1.0 (its Expect is dropped).
    """
    out, corr_in = _filter_request(headers, websocket, http10)
    corr = correlation_id(corr_in)
    out += _route_context(route)
    out.append((b"X-Sentin8-Hostname", hostname.encode()))
    out.append((b"X-Sentin8-Correlation-Id", corr))
    out.append((b"X-Sentin8-Caller-Service", b"external"))
    if client_cert:
        out.append((b"X-Sentin8-Client-Cert", base64.b64encode(client_cert)))
    out.append((b"X-Forwarded-For", client_ip.encode()))
    out.append((b"X-Forwarded-Proto", proto.encode()))
    out.append((b"X-Forwarded-Host", host))
    return out, corr


_ROUTE_CONTEXT: dict[Route, tuple[Header, ...]] = {}


def _route_context(route: Route) -> tuple[Header, ...]:
    """The route's tenant context headers, encoded once per route (a Route is frozen and hashable: the same
    route in a new snapshot finds its entry). Bounded: a registry that churns routes cannot grow it past 10,000."""
    got = _ROUTE_CONTEXT.get(route)
    if got is None:
        if len(_ROUTE_CONTEXT) >= 10_000:
            _ROUTE_CONTEXT.clear()
        pairs = [(b"X-Sentin8-Env-Id", route.env_id.encode()), (b"X-Sentin8-App-Id", route.app_id.encode())]
        if route.org_id:
            pairs.append((b"X-Sentin8-Org-Id", route.org_id.encode()))
        pairs.append((b"X-Sentin8-Service", route.service.encode()))
        got = _ROUTE_CONTEXT[route] = tuple(pairs)
    return got


def passthrough_headers(headers: list[Header], *, websocket: bool = False, http10: bool = False) -> list[Header]:
    """The ACME passthrough: the same stripping, nothing injected."""
    return _filter_request(headers, websocket, http10)[0]


def response_headers(headers: list[Header], *, interim: bool = False, upgrade: bool = False) -> list[Header]:
    """The backend's response headers as the client gets them: hop-by-hop and reserved ``x-sentin8-*`` names
    dropped (the platform's internal vocabulary never leaves it, whoever wrote it); the bridge adds its own
    framing and Connection.

    Content-Length is kept on a final response: it is the framing for fixed-length bodies and meaningful on
    HEAD/304. ``interim`` (a 1xx): Content-Length goes too, a 1xx has no body. ``upgrade`` (a WebSocket 101,
    an interim response too): the switch is re-stated as ``Connection: Upgrade`` and ``Upgrade: websocket``.
    """
    out: list[Header] = []
    tokens: list[bytes] = []
    drop = _INTERIM_DROP if interim or upgrade else _RESPONSE_DROP
    for header in headers:
        name = header[0]  # bytes, typed in headers.pxd (as in _filter_request)
        low = name.lower()
        if low in drop:
            if low == b"connection":
                tokens += _listed_in_connection(header[1], _RESPONSE_CONNECTION_OPTIONS)
        # Reserved in either spelling (as for requests). Every such name sorts at or after "x-sentin8-" ("_"
        # sorts after "-"), so one comparison clears nearly every header.
        elif low < RESERVED_PREFIX or not (low.replace(b"_", b"-") if low.find(b"_") >= 0 else low).startswith(
            RESERVED_PREFIX
        ):
            out.append(header)
    out = _drop_listed(out, tokens)
    if upgrade:
        out.append((b"Connection", b"Upgrade"))
        out.append((b"Upgrade", b"websocket"))  # switch_refusal (websocket.py) made sure it said exactly this
    return out
