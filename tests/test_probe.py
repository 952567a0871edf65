"""``sentin8-proxy probe``: its sans-IO half (sentin8/probe.py) byte by byte, then the command against real
servers: an HTTP/2 server over PQ TLS on our engine (tests/h2loopback.py), a classical-only TLS backend (the
handshake must fail, with curl's code 35), a certificate that does not verify (60). The L7 edge itself, the
HTTP/1.1 path and the h2 fallback are run against the demo (tests/test_demo.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sentin8 import probe as p
from tests.h2loopback import LoopbackH2Server
from tests.peers import REPO


def run_probe(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "probe", *args], cwd=REPO, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


# -- sans-IO -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "host", "port", "path", "authority"),
    [
        ("https://shop.example.com", "shop.example.com", 443, "/", "shop.example.com"),
        ("https://Shop.Example.COM:8443/a/b?x=1&y=%3C", "shop.example.com", 8443, "/a/b?x=1&y=%3C",
         "shop.example.com:8443"),
        ("https://[::1]:9443/", "::1", 9443, "/", "[::1]:9443"),
        ("https://127.0.0.2/x", "127.0.0.2", 443, "/x", "127.0.0.2"),
        ("https://bücher.example/", "xn--bcher-kva.example", 443, "/", "xn--bcher-kva.example"),
    ],
)  # fmt: skip
def test_urls_parse_to_host_port_path_and_authority(url, host, port, path, authority):
    t = p.parse_url(url)
    assert (t.host, t.port, t.path, t.authority) == (host, port, path, authority)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://shop.example.com/", "scheme"),
        ("shop.example.com", "scheme"),
        ("https:///path", "no host"),
        ("https://shop.example.com:99999/", "Port out of range"),
        ("https://shop.example.com:http/", "malformed URL"),
        ("https://shop.example.com/a b", "white space"),
        ("https://user:pw@shop.example.com/", "credentials"),
        ("https://sh*p.example.com/", "malformed host"),
    ],
)
def test_bad_urls_are_refused_with_curls_code_3(url, why):
    with pytest.raises(p.ProbeError) as err:
        p.parse_url(url)
    assert err.value.code == p.EXIT_URL and why.lower() in str(err.value).lower()


def test_resolve_entries_parse_and_the_last_match_wins():
    assert p.parse_resolve("Shop.Example.com:8443:127.0.0.2") == ("shop.example.com", 8443, "127.0.0.2")
    assert p.parse_resolve("h:443:[::1]") == ("h", 443, "::1")
    target = p.parse_url("https://shop.example.com:8443/")
    entries = [("shop.example.com", 8443, "10.0.0.1"), ("other", 8443, "10.0.0.2"), ("shop.example.com", 8443, "::1")]
    assert p.pick_address(target, entries) == "::1"
    assert p.pick_address(target, [("shop.example.com", 443, "10.0.0.1")]) is None
    for bad in ("h:443", "h:0:1.2.3.4", "h:x:1.2.3.4", "h:443:not-an-ip", ":443:1.2.3.4"):
        with pytest.raises(p.ProbeError) as err:
            p.parse_resolve(bad)
        assert err.value.code == p.EXIT_USAGE


def test_headers_replace_or_remove_the_defaults_and_data_makes_a_post():
    t = p.parse_url("https://shop.example.com:8443/api")
    req = p.build_request(t, [p.parse_header("accept: text/plain"), p.parse_header("User-Agent:"),
                              p.parse_header("X-Trace:  abc ")], b"a=1", "probe/1")  # fmt: skip
    assert req.method == "POST" and req.body == b"a=1"
    assert req.headers == (
        ("Host", "shop.example.com:8443"),
        ("Content-Type", "application/x-www-form-urlencoded"),
        ("Content-Length", "3"),
        ("accept", "text/plain"),
        ("X-Trace", "abc"),
    )
    wire = p.http1_bytes(req)
    assert wire.startswith(b"POST /api HTTP/1.1\r\nHost: shop.example.com:8443\r\n") and wire.endswith(b"\r\n\r\na=1")
    for bad in ("NoColon", "Bad Name: x", "X: a\rb", ": x"):
        with pytest.raises(p.ProbeError):
            p.parse_header(bad)


def test_the_http2_form_has_pseudo_headers_first_and_no_connection_fields():
    t = p.parse_url("https://shop.example.com/x?y")
    req = p.build_request(t, [("Connection", "keep-alive"), ("TE", "gzip"), ("X-A", "1")], None, "probe/1")
    assert p.h2_fields(req) == [
        (b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"shop.example.com"), (b":path", b"/x?y"),
        (b"user-agent", b"probe/1"), (b"accept", b"*/*"), (b"x-a", b"1"),
    ]  # fmt: skip


def _read(chunks: list[bytes], eof: bool = False) -> p.Response:
    reader = p.Http1Reader()
    for c in chunks:
        if reader.feed(c):
            return reader.response  # type: ignore[return-value]
    assert eof, "the response should have been complete"
    return reader.finish()


def test_http1_responses_by_length_chunks_and_close_and_interim_heads_skipped():
    r = _read([b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhel", b"lo"])
    assert (r.version, r.status, r.reason, r.body, r.keep_alive) == ("HTTP/1.1", 200, "OK", b"hello", True)
    assert r.headers == [("Content-Length", "5"), ("X-A", "b")]
    r = _read([b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab", b"c\r\n0\r\n\r\n"])
    assert (r.status, r.body) == (404, b"abc")
    r = _read([b"HTTP/1.0 200 OK\r\n\r\nuntil", b" the close"], eof=True)
    assert (r.body, r.keep_alive) == (b"until the close", False)
    r = _read([b"HTTP/1.1 429 Too Many Requests\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"])
    assert (r.status, r.keep_alive) == (429, False)


@pytest.mark.parametrize(
    ("chunks", "why"),
    [
        ([], "before a status line"),
        ([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"], "in the middle"),
        ([b"HTTP/1.1 200 OK\r\nContent-Le"], "in the middle"),
        ([b"NOT HTTP AT ALL\r\n\r\n"], "malformed"),
    ],
)
def test_an_incomplete_or_malformed_response_is_curls_code_56(chunks, why):
    with pytest.raises(p.ProbeError) as err:
        _read(chunks, eof=True)
    assert err.value.code == p.EXIT_RECV and why in str(err.value)


def test_report_helpers():
    assert p.status_summary([200, 200, 429, 200, 429]) == "200 x3, 429 x2"
    assert p.body_text(b"hi\n") == "hi\n" and p.body_text(b"\x00\x01") is None and p.body_text(b"\xff") is None
    assert p.body_text(b"x" * (p.BODY_SHOWN_MAX + 1)) is None
    lines = p.response_lines(p.Response("HTTP/2", 200, "", [("a", "b")], b"\x00" * 3))
    assert lines == ["< HTTP/2 200", "< a: b", "<", "* body:       3 bytes (binary or long: not shown)"]


# -- the command against real servers -----------------------------------------------------------------


@pytest.fixture
def h2server():
    server = LoopbackH2Server(names=("loopback.test",))
    yield server
    server.close()
    assert not server.errors


def test_http2_through_the_engine_client_adapter(h2server):
    url = f"https://loopback.test:{h2server.port}"
    resolve = ("--resolve", f"loopback.test:{h2server.port}:127.0.0.1")
    out = run_probe(*resolve, "-k", "--http2", f"{url}/bytes/5000")
    assert out.returncode == 0, out.stderr
    expected = (
        "* group:      X25519MLKEM768",
        "* signature:  mldsa65",
        "* ALPN:       h2",
        "* TLS:        TLSv1.3",
        "> :authority: loopback.test:",
        "< HTTP/2 200",
        "* body:       5000 bytes",
        "* subject:    CN=loopback.test",
        "* SANs:       DNS:loopback.test",
        "* verified:   no (--insecure)",
    )
    for line in expected:
        assert line in out.stdout, (line, out.stdout)
    assert "days left" in out.stdout or "h left" in out.stdout
    out = run_probe(*resolve, "-k", "--http2", "--repeat", "3", "--data", "ping-pong", f"{url}/echo")
    assert out.returncode == 0, out.stderr
    assert "ping-pong" in out.stdout and "* statuses:   200 x3" in out.stdout
    assert [h.method for h in h2server.heads[-3:]] == [b"POST"] * 3


def test_a_certificate_that_does_not_verify_is_curls_code_60(h2server, tmp_path):
    out = run_probe("--resolve", f"loopback.test:{h2server.port}:127.0.0.1", f"https://loopback.test:{h2server.port}/")
    assert out.returncode == p.EXIT_VERIFY, out
    assert "certificate verification failed: self-signed certificate" in out.stderr and "--cafile" in out.stderr


def test_a_classical_only_server_fails_the_handshake_with_the_reason(backend_factory):
    classic = backend_factory("classic", "classic.test")  # stdlib ssl on the system OpenSSL 3.0: no ML-KEM
    out = run_probe(
        "-k", "--resolve", f"classic.test:{classic.port}:127.0.0.1", f"https://classic.test:{classic.port}/"
    )
    assert out.returncode == p.EXIT_TLS, out
    assert "TLS handshake failed:" in out.stderr and "X25519MLKEM768" in out.stderr
    assert out.stdout == ""  # nothing claimed about a connection that never was


def test_usage_errors_exit_before_any_connection():
    assert run_probe("http://x/").returncode == p.EXIT_URL
    assert run_probe("--resolve", "nonsense", "https://x/").returncode == p.EXIT_USAGE
    out = run_probe("https://nope.invalid/")
    assert out.returncode == p.EXIT_RESOLVE and "cannot resolve nope.invalid" in out.stderr
