"""The Cython-compiled sans-IO modules against the same modules run as pure Python, call by call.

    ./dev compile && .venv/bin/python -m bench.native [--rounds 7]

Both builds in one process, on the same inputs: the compiled modules are imported as usual (the extensions
``cython_build.py`` left beside the sources), and each measured ``.py`` (``SANS_IO``, a part of
``sentin8.native.MODULES``) is loaded a second time from its source file under another name, so the pure one
runs the same code. The whole request path, compiled against pure, is ``bench.profile.keepalive``. Inputs are what one
connection and one keep-alive request carry through the hot functions: a real X25519MLKEM768 ClientHello, the
request head wrk sends, a backend nginx's response head. Prints nanoseconds per call (the best of ``--rounds``)
and the speed-up, then the per-request and per-connection sums. A load test, never a timed test.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import time
from collections.abc import Callable
from types import ModuleType

from OpenSSL import SSL

from bench import pqtls
from sentin8 import native
from sentin8.routing import Route


def _pure(name: str) -> ModuleType:
    """``name`` loaded from its .py file under ``<name>__pure`` (its package stays ``name``'s, so relative
    imports resolve to the real siblings)."""
    spec = importlib.util.spec_from_file_location(name + "__pure", native.source(name))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def _pq_hello(sni: bytes) -> bytes:
    conn = SSL.Connection(pqtls.client_context([b"http/1.1"]), None)
    conn.set_connect_state()
    conn.set_tlsext_host_name(sni)
    try:
        conn.do_handshake()
    except SSL.WantReadError:
        pass
    return conn.bio_read(65536)


REQUEST = [(b"Host", b"bench.test:8443"), (b"User-Agent", b"wrk/4.2"), (b"Accept", b"*/*")]
BROWSER = [
    (b"Host", b"shop.example.com"),
    (b"User-Agent", b"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0"),
    (b"Accept", b"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"),
    (b"Accept-Language", b"en-GB,en;q=0.9"),
    (b"Accept-Encoding", b"gzip, deflate, br, zstd"),
    (b"Cookie", b"session=7f9a0c1d2e3f; theme=dark"),
    (b"Connection", b"keep-alive"),
    (b"X-Correlation-Id", b"req-12345"),
]
RESPONSE = [
    (b"Server", b"nginx/1.26.3"),
    (b"Date", b"Mon, 30 Nov 2026 23:00:00 GMT"),
    (b"Content-Type", b"text/plain"),
    (b"Content-Length", b"63"),
    (b"Connection", b"keep-alive"),
]
ROUTE = Route(hostname="bench.test", service="web", env_id="env-1", app_id="app-1", org_id="org-1")


SANS_IO = (
    "sentin8.clienthello",
    "sentin8.netclass",
    "sentin8.tokenbucket",
    "sentin8.http.framing",
    "sentin8.http.head_writer",
    "sentin8.http.headers",
    "sentin8.http.response",
)


def cases(m: dict[str, ModuleType]) -> dict[str, tuple[str, Callable[[], object]]]:
    """name -> (per "request" or "connection" or "other", a call with its inputs bound)."""
    ch, nc, tb = m["sentin8.clienthello"], m["sentin8.netclass"], m["sentin8.tokenbucket"]
    fr, hw = m["sentin8.http.framing"], m["sentin8.http.head_writer"]
    hd, rs = m["sentin8.http.headers"], m["sentin8.http.response"]
    hello = _pq_hello(b"bench.test")
    classifier = nc.Classifier(["10.0.0.0/8", "fd00::/8"])
    raw = b"GET / HTTP/1.1\r\n" + b"".join(b"%s: %s\r\n" % h for h in REQUEST) + b"\r\n"
    head = fr.validate_request(b"GET", b"/", "1.1", REQUEST, keep_alive=True, upgrade=False)
    fwd, _ = hd.forward_headers(
        REQUEST, ROUTE, client_ip="127.0.0.1", proto="https", host=b"bench.test:8443", hostname="bench.test"
    )
    body = b"x" * 63

    def budget() -> None:
        b = fr.HeaderBudget(100, 16384)
        for name, value in REQUEST:
            b.add(name, value)

    return {
        "clienthello.parse (PQ hello, 1 record)": ("connection", lambda: ch.parse(hello)),
        "netclass.is_internal (cached)": ("connection", lambda: classifier.is_internal("127.0.0.1")),
        "tokenbucket.refill + take": ("other", lambda: tb.take(tb.refill(500_000, 0, 1_000, 100.0, 10.0))),
        "framing.HeaderBudget.add x3": ("request", budget),
        "framing.request_line_is_http": ("request", lambda: fr.request_line_is_http(raw, b"GET", b"/")),
        "framing.validate_request (wrk)": (
            "request",
            lambda: fr.validate_request(b"GET", b"/", "1.1", REQUEST, keep_alive=True, upgrade=False),
        ),
        "framing.validate_request (browser)": (
            "other",
            lambda: fr.validate_request(b"GET", b"/", "1.1", BROWSER, keep_alive=True, upgrade=False),
        ),
        "headers.forward_headers (wrk)": (
            "request",
            lambda: hd.forward_headers(
                head.headers, ROUTE, client_ip="127.0.0.1", proto="https", host=head.authority, hostname=head.host
            ),
        ),
        "headers.forward_headers (browser)": (
            "other",
            lambda: hd.forward_headers(
                BROWSER, ROUTE, client_ip="127.0.0.1", proto="https", host=b"shop.example.com", hostname="shop"
            ),
        ),
        "head_writer.request_head": ("request", lambda: hw.request_head(b"GET", b"/", fwd, framing=None)),
        "headers.response_headers": ("request", lambda: hd.response_headers(RESPONSE)),
        "response.response_framing": (
            "request",
            lambda: rs.response_framing(
                200, RESPONSE, head_only=False, version="1.1", keep_alive=True, websocket=False, draining=False
            ),
        ),
        "head_writer.response_head": ("request", lambda: hw.response_head(200, b"OK", RESPONSE)),
        "response.encode_chunks (63 B)": ("other", lambda: rs.encode_chunks(body, 16384)),
    }


def best_ns(fn: Callable[[], object], rounds: int) -> float:
    """Nanoseconds per call, the best of ``rounds`` rounds of ~50 ms each."""
    n = 1
    while True:  # calibrate: enough calls for ~50 ms
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        spent = time.perf_counter_ns() - t0
        if spent > 50_000_000:
            break
        n *= 4
    best = spent / n
    for _ in range(rounds - 1):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    names = list(SANS_IO)
    compiled = {n: importlib.import_module(n) for n in names}
    if native.state() != "compiled" or any(not str(m.__file__).endswith(".so") for m in compiled.values()):
        print("bench.native: the compiled build is not loaded (./dev compile first)", file=sys.stderr)
        return 2
    pure = {n: _pure(n) for n in names}
    rows = []
    totals: dict[str, list[float]] = {}
    for (label, (kind, fn_pure)), (_, (_, fn_comp)) in zip(cases(pure).items(), cases(compiled).items(), strict=True):
        p, c = best_ns(fn_pure, a.rounds), best_ns(fn_comp, a.rounds)
        rows.append((label, p, c))
        if kind != "other":
            t = totals.setdefault(kind, [0.0, 0.0])
            t[0] += p
            t[1] += c
    print("| call | pure ns | compiled ns | speed-up |\n|---|---|---|---|")
    for label, p, c in rows:
        print(f"| {label} | {p:,.0f} | {c:,.0f} | {p / c:.2f}x |")
    for kind, (p, c) in totals.items():
        print(f"| **sum per {kind}** | {p:,.0f} | {c:,.0f} | {p / c:.2f}x (saves {(p - c) / 1000:.2f} µs) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
