"""HTTP/1.1 message heads as the proxy writes them, sans-IO: the upstream request head, a response head to the
client, and the answers the proxy gives itself (``error_response``, ``local_response``).

A head is a start line, ``name: value CRLF`` per field and the blank line. Compiled, ``_head`` sizes it and
copies every piece once into one new bytes object (C helpers declared in ``head_writer.pxd``); pure, and for
any piece that is not ``bytes`` in a list or tuple, one join. Standard status lines are made once, at import.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..native import loaded_compiled
from .framing import Header

_COMPILED = loaded_compiled(__file__)  # compiled, heads are written by C copies (_head)

REASONS: dict[int, bytes] = {
    100: b"Continue",
    101: b"Switching Protocols",
    200: b"OK",
    400: b"Bad Request",
    403: b"Forbidden",
    404: b"Not Found",
    405: b"Method Not Allowed",
    408: b"Request Timeout",
    414: b"URI Too Long",
    421: b"Misdirected Request",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
}

_error_cache: dict[tuple[int, bool], bytes] = {}


def error_response(status: int, *, head_only: bool = False) -> bytes:
    """A complete error response with ``Connection: close``; the body names the status and nothing else."""
    key = (status, head_only)
    msg = _error_cache.get(key)
    if msg is None:
        reason = REASONS.get(status, b"Error")
        body = b"%d %s\n" % (status, reason)
        msg = (
            b"HTTP/1.1 %d %s\r\n"
            b"Content-Type: text/plain; charset=utf-8\r\n"
            b"Content-Length: %d\r\n"
            b"Cache-Control: no-store\r\n"
            b"Connection: close\r\n\r\n" % (status, reason, len(body))
        )
        if not head_only:
            msg += body
        _error_cache[key] = msg
    return msg


def local_response(
    status: int, headers: Iterable[Header] = (), *, close: bool, head_only: bool = False, body: bytes | None = None
) -> bytes:
    """A response the proxy answers itself (a refusal that may keep the connection, unlike ``error_response``)."""
    reason = REASONS.get(status, b"Error")
    if body is None:
        body = b"%d %s\n" % (status, reason)
    parts = [
        b"HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
        b"Cache-Control: no-store\r\n" % (status, reason, len(body))
    ]
    _add_fields(parts, headers)
    parts.append(b"Connection: close\r\n\r\n" if close else b"\r\n")
    if not head_only:
        parts.append(body)
    return b"".join(parts)


def request_head(method: bytes, target: bytes, headers: Iterable[Header], *, framing: Header | None) -> bytes:
    """The upstream request head (always HTTP/1.1); ``framing`` is Content-Length or Transfer-Encoding."""
    return _head([method, b" ", target, b" HTTP/1.1\r\n"], headers, () if framing is None else (framing,))


def response_head(status: int, reason: bytes, headers: Iterable[Header], extra: Iterable[Header] = ()) -> bytes:
    return _head([_status_line(status, reason)], headers, extra)


def _head(lead: list[bytes], headers: Iterable[Header], extra: Iterable[Header]) -> bytes:
    """``lead``'s pieces, each field of ``headers`` then of ``extra`` as ``name: value CRLF``, and the blank line.

    Compiled, when every piece is ``bytes`` and both field collections are lists or tuples (as every caller's
    are): sized in one pass, then copied into one new bytes object in a second. A join built a list of ~50
    pieces per head and took a buffer view of each: ~14k instructions for a request's two heads
    (``bench.profile.keepalive``, callgrind). Anything else, and the pure build, take the join."""
    if _COMPILED:
        head = _head_in_one_copy(lead, headers, extra)
        if head is not None:
            return head
    parts = list(lead)
    _add_fields(parts, headers)
    _add_fields(parts, extra)
    parts.append(b"\r\n")
    return b"".join(parts)


def _head_in_one_copy(lead: list[bytes], headers: Iterable[Header], extra: Iterable[Header]) -> bytes | None:
    """Compiled only (the C names are head_writer.pxd's): ``_head``'s bytes, or None for a piece it cannot copy.

    The sizing pass checks every object's type, then reads sizes with the unchecked C macros; the copy pass
    holds the same objects in ``bytes``-typed names: no length goes through the generic ``len()`` (90 such
    calls per keep-alive GET before), and no tuple is built to walk the two field collections."""
    size = 2
    for item in lead:
        if type(item) is not bytes:
            return None
        size += PyBytes_GET_SIZE(item)  # noqa: F821
    sized = _fields_size(headers)
    if sized < 0:
        return None
    size += sized
    sized = _fields_size(extra)
    if sized < 0:
        return None
    size += sized
    head = _new_bytes(size)  # noqa: F821 (head_writer.pxd declares both: uninitialised, filled below)
    at = PyBytes_AS_STRING(head)  # noqa: F821
    end = at + size - 2  # where the pieces and fields end; the blank line after them
    for piece in lead:
        at = _put(at, piece)
    at = _put_fields(at, end, headers)
    at = _put_fields(at, end, extra)
    at[0] = 13
    at[1] = 10
    return head


def _fields_size(fields: Iterable[Header]) -> int:
    """Compiled only: the bytes of ``fields`` as ``name: value CRLF`` lines; -1 unless they are a list or tuple
    of (bytes, bytes) tuples."""
    if type(fields) is not list and type(fields) is not tuple:
        return -1
    size = 0
    for item in fields:
        if type(item) is not tuple or PyTuple_GET_SIZE(item) != 2:  # noqa: F821
            return -1
        name, value = item
        if type(name) is not bytes or type(value) is not bytes:
            return -1
        size += PyBytes_GET_SIZE(name) + PyBytes_GET_SIZE(value) + 4  # noqa: F821
    return size


def _put_fields(at, end, fields: Iterable[Header]):  # at, end: C pointers (head_writer.pxd)
    """Compiled only: ``fields`` (sized by ``_fields_size``) written from ``at`` as header lines; where they
    ended. What was sized is what is copied (no Python code runs between the passes); the bound check keeps a
    write inside the object even if that ever stopped being true."""
    for key, text in fields:
        if at + len(key) + len(text) + 4 > end:
            raise RuntimeError("a head's fields changed while it was written")
        at = _put(at, key)
        at[0] = 58  # ": "
        at[1] = 32
        at = _put(at + 2, text)
        at[0] = 13  # CRLF
        at[1] = 10
        at += 2
    return at


def _put(at, data: bytes):  # at: a C pointer (head_writer.pxd)
    """Compiled only: ``data`` copied to ``at``; where the copy ended."""
    memcpy(at, PyBytes_AS_STRING(data), len(data))  # noqa: F821 (head_writer.pxd declares both)
    return at + len(data)


_STATUS_LINES: dict[int, bytes] = {code: b"HTTP/1.1 %d %s\r\n" % (code, text) for code, text in REASONS.items()}


def _status_line(status: int, reason: bytes) -> bytes:
    """``HTTP/1.1 <status> <reason>``: made once per status when the reason is the standard one (a backend's
    "200 OK"), formatted otherwise (formatting is ~1k instructions, most of a small response's head)."""
    reasons, lines = REASONS, _STATUS_LINES  # dicts typed in head_writer.pxd: each get a C call, not a method by name
    if not reason or reason == reasons.get(status):
        line = lines.get(status)
        if line is not None:
            return line
    return b"HTTP/1.1 %d %s\r\n" % (status, reason or reasons.get(status, b""))


def _add_fields(parts: list[bytes], headers: Iterable[Header]) -> None:
    """Each header as ``name: value CRLF``, its four pieces added to ``parts`` for the caller's one join: no
    bytes object is made per field (a head of 13 fields: ~30% less than joining per field, then per head)."""
    add = parts.extend
    for name, value in headers:
        add((name, b": ", value, b"\r\n"))
