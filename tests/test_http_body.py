"""Request-body bounds (sentin8/http/body.py) and reading llhttp's chunk size and HTTP version
(sentin8/http/llhttp_private.py)."""

from __future__ import annotations

import httptools
import pytest

from sentin8.http import llhttp_private
from sentin8.http.body import MAX_CHUNK_SIZE, body_over_limit, chunk_size_acceptable
from sentin8.http.llhttp_private import VERSIONS, chunk_size_view, version_view


def test_chunk_size_bounds():
    assert MAX_CHUNK_SIZE == 2**63 - 1
    for ok in (0, 1, 16384, 2**32, 2**62, 2**63 - 1):
        assert chunk_size_acceptable(ok)
    for bad in (2**63, 2**63 + 1, 2**64 - 1, -1):
        assert not chunk_size_acceptable(bad)


@pytest.mark.parametrize(
    ("total", "cap", "over"),
    [
        (None, 0, False),
        (None, 10, False),
        (0, 0, False),
        (10**18, 0, False),  # 0 = no cap
        (10, 10, False),  # at the cap is within it
        (11, 10, True),
        (0, 1, False),
        (2**64, 2**63, True),
    ],
)
def test_body_over_limit(total, cap, over):
    assert body_over_limit(total, cap) is over


def test_the_pinned_httptools_layout_is_verified():
    """If an httptools upgrade moves its fields, this fails here (and workers fall back to streamed counts)."""
    assert llhttp_private.layout_verified()


class _Sizes:
    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.view = chunk_size_view(self.parser)
        self.sizes: list[int] = []

    def on_chunk_header(self) -> None:
        assert self.view is not None
        self.sizes.append(self.view.value)


HEAD = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    ("line", "size"),
    [
        (b"0", 0),
        (b"5", 5),
        (b"a", 10),
        (b"A", 10),
        (b"4000", 16384),
        (b"7fffffffffffffff", 2**63 - 1),
        (b"7FFFFFFFFFFFFFFF", 2**63 - 1),
        (b"8000000000000000", 2**63),
        (b"ffffffffffffffff", 2**64 - 1),
        (b"0000000000000000000000008000000000000000", 2**63),  # leading zeros: llhttp takes any number
        (b"8000000000000000;ext=1", 2**63),
        (b'8000000000000000;name="quoted;value"', 2**63),
        (b"1;a;b=c", 1),
    ],
)
def test_chunk_size_view_reads_what_llhttp_parsed(line, size):
    p = _Sizes()
    p.parser.feed_data(HEAD + line + b"\r\n")
    assert p.sizes == [size]


def test_chunk_size_view_follows_every_chunk_across_reads():
    p = _Sizes()
    raw = HEAD + b"3\r\nabc\r\n10\r\n" + b"x" * 16 + b"\r\n8000000000000000\r\nzz"
    for i in range(len(raw)):  # one byte per read: the size line split everywhere
        p.parser.feed_data(raw[i : i + 1])
    assert p.sizes == [3, 16, 2**63]


def test_llhttp_refuses_sizes_past_2_64_itself():
    p = _Sizes()
    with pytest.raises(httptools.HttpParserError):
        p.parser.feed_data(HEAD + b"10000000000000000\r\n")
    assert p.sizes == []


def test_a_view_is_refused_for_an_object_that_is_not_a_request_parser():
    class NotAParser:
        pass

    assert chunk_size_view(NotAParser()) is None  # type: ignore[arg-type]


class _Versions:
    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.view = version_view(self.parser)
        self.seen: list[tuple[str | None, str]] = []

    def on_headers_complete(self) -> None:
        assert self.view is not None
        self.seen.append((VERSIONS.get(self.view.value), self.parser.get_http_version()))


def test_the_version_view_names_what_the_parser_formats():
    """Pipelined on one parser: each head's view names the version get_http_version formats; a version outside
    VERSIONS (llhttp takes 0.9 and 2.0 request lines too) reads as no name, so the caller asks the parser."""
    v = _Versions()
    v.parser.feed_data(
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.0\r\n\r\n"
    )
    assert v.seen == [("1.1", "1.1"), ("1.0", "1.0"), ("1.1", "1.1"), ("1.0", "1.0")]
    other = _Versions()
    try:
        other.parser.feed_data(b"GET / HTTP/2.0\r\nHost: a\r\n\r\n")
    except httptools.HttpParserError:
        pass  # a build that refuses it has nothing to name
    assert all(name is None and version not in ("1.0", "1.1") for name, version in other.seen)


def test_no_view_for_an_object_that_is_not_a_parser():
    assert version_view(object()) is None  # type: ignore[arg-type]
    assert chunk_size_view(object()) is None  # type: ignore[arg-type]
