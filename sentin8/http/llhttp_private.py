"""Read two fields of llhttp's parser struct that httptools does not hand out as they are: the size of the chunk
just parsed (httptools reports ``on_chunk_header`` but not the size) and the request's HTTP version.

llhttp keeps a chunk's declared size in its parser struct (``llhttp_t.content_length``, set when the size
line is complete, before ``on_chunk_header`` runs) and accepts any size up to 2^64 - 1. To refuse sizes that
cannot be real (``sentin8/http/body.py``) the bridge reads that field: httptools' ``HttpParser`` object holds
the ``llhttp_t *`` as its first C field (after the object header and Cython's vtable pointer, parser.pyx),
and the struct's layout is llhttp's (httptools' ``cparser.pxd``), mirrored below.

The version: httptools' ``get_http_version`` formats ``"{}.{}"`` with ``str.format`` for every request (~2 µs
of a keep-alive GET's ~180 on a slow 2-core VM, perf); the struct's ``http_major`` and ``http_minor`` bytes,
read as one 16-bit number, name the same version through ``VERSIONS`` (another version falls back to
``get_http_version``).

Safety, as in ``sentin8/openssl_private.py``: nothing is trusted unchecked. Once per process probe parsers
are fed a chunk of a known size over HTTP/1.1 and a plain HTTP/1.0 request; the pointer must lead to a struct
whose ``data`` field points back at the parser object (httptools stores ``self`` there), whose
``content_length`` reads the size that was sent and whose version bytes read each version sent.
Every parser is checked again (its ``data`` back-pointer) before its view is handed out. A mismatch (another
httptools layout) makes ``chunk_size_view`` and ``version_view`` return None: the caller then cannot see chunk
sizes, says so once (``chunk_sizes_unchecked`` event) and still bounds bodies by the bytes streamed, and reads
versions through ``get_http_version``. httptools is pinned exactly
(pyproject.toml), and ``tests/test_http_body.py`` fails if the probe does.
"""

from __future__ import annotations

import ctypes
import sys
from functools import cache

import httptools

from sentin8.eventlog import event


class _Llhttp(ctypes.Structure):
    """The head of ``llhttp__internal_s`` (httptools/parser/cparser.pxd), up to the fields read here."""

    _fields_ = [
        ("_index", ctypes.c_int32),
        ("_span_pos0", ctypes.c_void_p),
        ("_span_cb0", ctypes.c_void_p),
        ("error", ctypes.c_int32),
        ("reason", ctypes.c_void_p),
        ("error_pos", ctypes.c_void_p),
        ("data", ctypes.c_void_p),
        ("_current", ctypes.c_void_p),
        ("content_length", ctypes.c_uint64),
        ("type", ctypes.c_uint8),
        ("method", ctypes.c_uint8),
        ("http_major", ctypes.c_uint8),
        ("http_minor", ctypes.c_uint8),
    ]


_POINTER = ctypes.sizeof(ctypes.c_void_p)
_CPARSER_AT = 3 * _POINTER  # ob_refcnt, ob_type, __pyx_vtab, then HttpParser._cparser
_DATA_AT = _Llhttp.data.offset
_LENGTH_AT = _Llhttp.content_length.offset
_VERSION_AT = _Llhttp.http_major.offset  # http_minor follows: both read as one c_uint16


def _version_key(major: int, minor: int) -> int:
    """What a ``version_view`` reads for ``major.minor`` (the two bytes in memory order)."""
    return int.from_bytes(bytes((major, minor)), sys.byteorder)


# The versions a request line may carry past validation, by what ``version_view`` reads.
VERSIONS: dict[int, str] = {_version_key(1, 1): "1.1", _version_key(1, 0): "1.0"}
_PROBE_SIZE = 0x7EDCBA9876543210  # a size no other field could hold by chance


def _struct_of(parser: httptools.HttpRequestParser) -> int | None:
    """The address of ``parser``'s llhttp_t, when its ``data`` field points back at ``parser``."""
    if not isinstance(parser, httptools.HttpRequestParser) or type(parser).__basicsize__ < _CPARSER_AT + _POINTER:
        return None
    address = ctypes.c_void_p.from_address(id(parser) + _CPARSER_AT).value
    if not address or address % _POINTER:
        return None
    if ctypes.c_void_p.from_address(address + _DATA_AT).value != id(parser):
        return None
    return address


class _Probe:
    __slots__ = ("parser", "seen", "version")

    def __init__(self, data: bytes) -> None:
        self.seen: int | None = None
        self.version: int | None = None
        self.parser = httptools.HttpRequestParser(self)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.seen = self.version = None
        finally:
            self.parser = None  # type: ignore[assignment]  # the parser holds the probe's bound callbacks

    def on_headers_complete(self) -> None:
        view = _field(self.parser, ctypes.c_uint16, _VERSION_AT)
        self.version = None if view is None else view.value

    def on_chunk_header(self) -> None:
        view = _field(self.parser, ctypes.c_uint64, _LENGTH_AT)
        self.seen = None if view is None else view.value


@cache
def layout_verified() -> bool:
    """Whether this httptools build keeps the layout read here (checked once per process)."""
    chunked = _Probe(b"POST / HTTP/1.1\r\nHost: probe\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n" % _PROBE_SIZE)
    plain = _Probe(b"GET / HTTP/1.0\r\n\r\n")
    if chunked.seen != _PROBE_SIZE or chunked.version != _version_key(1, 1) or plain.version != _version_key(1, 0):
        event(
            "chunk_sizes_unchecked", "warning", httptools=httptools.__version__, read=chunked.seen,
            versions_read=[chunked.version, plain.version],
        )  # fmt: skip
        return False
    return True


def _field(
    parser: httptools.HttpRequestParser, ctype: type[ctypes._SimpleCData], at: int
) -> ctypes._SimpleCData | None:
    """A ``ctype`` view of the field ``at`` bytes into ``parser``'s struct, when ``_struct_of`` finds it."""
    address = _struct_of(parser)
    return None if address is None else ctype.from_address(address + at)


def chunk_size_view(parser: httptools.HttpRequestParser) -> ctypes.c_uint64 | None:
    """A live view of ``parser``'s current chunk size (read ``.value`` inside ``on_chunk_header``), or None
    when the layout cannot be verified. Valid while ``parser`` lives: drop it with the parser."""
    return _field(parser, ctypes.c_uint64, _LENGTH_AT) if layout_verified() else None


def version_view(parser: httptools.HttpRequestParser) -> ctypes.c_uint16 | None:
    """A live view of ``parser``'s HTTP version (read ``.value`` inside ``on_headers_complete``: a key of
    ``VERSIONS``), or None when the layout cannot be verified. Valid while ``parser`` lives."""
    return _field(parser, ctypes.c_uint16, _VERSION_AT) if layout_verified() else None
