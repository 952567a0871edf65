"""wrk and h2load from the PQ toolchain, and what their output says: rates, latencies and errors."""

from __future__ import annotations

import re
import statistics
import subprocess
import time
from pathlib import Path

from bench.clients import Sample
from bench.toolchain import Toolchain

GROUPS = "X25519MLKEM768"  # h2load's default group list has no ML-KEM; wrk uses OpenSSL 3.5's default (has it)


def _num(pattern: str, text: str, default: float | None = None) -> float | None:
    m = re.search(pattern, text)
    return float(m[1]) if m else default


def _h2load_errors(out: str) -> tuple[int, int, int]:
    """(succeeded, failed+errored+timeout, non-2xx)"""
    m = re.search(
        r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
        r"(\d+) errored, (\d+) timeout",
        out,
    )
    s = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
    if not m:
        return 0, 0, 0
    succeeded = int(m[4])
    errors = int(m[5]) + int(m[6]) + int(m[7])
    non2xx = int(s[2]) + int(s[3]) + int(s[4]) if s else 0
    return succeeded, errors, non2xx


def _finished(out: str) -> float | None:
    m = re.search(r"finished in ([\d.]+)(ms|s|us),", out)
    if not m:
        return None
    return float(m[1]) * {"s": 1.0, "ms": 1e-3, "us": 1e-6}[m[2]]


def _failed(res, what: str) -> str:
    text = (res.stderr or res.stdout or "").strip().splitlines()
    return f"{what} exit {res.returncode}: {text[-1][:100] if text else ''}"


def wrk(tc: Toolchain, url: str, conns: int, duration: float, threads: int = 2) -> Sample:
    """Keep-alive small requests, closed loop: requests/s."""
    res = tc.run(
        ["wrk", f"-t{threads}", f"-c{conns}", f"-d{duration:g}s", "--timeout", "5s", url], timeout=duration + 60
    )
    out = res.stdout
    rate = _num(r"Requests/sec:\s+([\d.]+)", out)
    total = _num(r"(\d+) requests in", out, 0)
    non2xx = int(_num(r"Non-2xx or 3xx responses: (\d+)", out, 0))
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    errors = sum(int(x) for x in sock.groups()) if sock else 0
    if res.returncode != 0 or rate is None:
        return Sample(None, 0, errors + non2xx, error=_failed(res, "wrk"))
    good = total - non2xx
    if good <= 0:
        return Sample(None, 0, errors + non2xx, error=f"no 2xx response ({errors} socket errors, {non2xx} non-2xx)")
    return Sample(good / total * rate, good, errors + non2xx, {"socket_errors": errors, "non2xx": non2xx})


def h2load_keepalive(tc: Toolchain, url: str, conns: int, duration: float, threads: int = 2) -> Sample:
    """``h2load --h1``: keep-alive small requests, closed loop: requests/s. No warm-up: its requests would not
    be counted while its CPU time would (the 64 handshakes at the start cost ~0.1 CPU-s)."""
    res = tc.run(
        [
            "h2load",
            "--h1",
            "--groups",
            GROUPS,
            f"-t{threads}",
            f"-c{conns}",
            "-D",
            f"{duration:g}",
            url,
        ],
        timeout=duration + 60,
    )
    return _h2load_rate(res)


def h2load_streams(tc: Toolchain, url: str, conns: int, streams: int, duration: float, threads: int = 2) -> Sample:
    """``h2load`` speaking HTTP/2 (ALPN h2): ``conns`` connections with ``streams`` concurrent streams each
    (``-m``), closed loop: requests/s."""
    res = tc.run(
        ["h2load", "--groups", GROUPS, f"-t{threads}", f"-c{conns}", f"-m{streams}", "-D", f"{duration:g}", url],
        timeout=duration + 60,
    )
    return _h2load_rate(res)


def page_loads(tc: Toolchain, url: str, objects: int, h2: bool, duration: float) -> Sample:
    """A page of ``objects`` small resources fetched from a fresh connection set, again and again for
    ``duration``: over h2 on one connection (all streams at once), or over HTTP/1.1 on six (a browser's
    per-origin limit, one request at a time each). Value: milliseconds per page, handshakes included."""
    args = ["-n", str(objects), "-c", "1", "-m", str(objects)] if h2 else ["--h1", "-n", str(objects), "-c", "6"]
    pages, took, errors = 0, 0.0, 0
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline or not pages:
        res = tc.run(["h2load", "--groups", GROUPS, *args, url], timeout=60)
        ok, err, non2xx = _h2load_errors(res.stdout)
        secs = _finished(res.stdout)
        errors += err + non2xx
        if res.returncode != 0 or secs is None or ok - non2xx < objects:
            return Sample(None, pages, errors, error=_failed(res, "h2load") if res.returncode else "a page incomplete")
        pages += 1
        took += secs
    return Sample(took / pages * 1e3, pages, errors)


def _h2load_rate(res: subprocess.CompletedProcess) -> Sample:
    """2xx responses per second of an h2load run; errors and non-2xx counted, never hidden."""
    ok, errors, non2xx = _h2load_errors(res.stdout)
    secs = _finished(res.stdout)
    good = ok - non2xx
    if not secs or good <= 0:
        return Sample(
            None,
            0,
            errors + non2xx,
            error=f"no 2xx response ({errors} errors, {non2xx} non-2xx)"
            if res.returncode == 0
            else _failed(res, "h2load"),
        )
    return Sample(good / secs, good, errors + non2xx)


def h2load_latency(
    tc: Toolchain, url: str, rate: int, conns: int, duration: float, log: Path, threads: int = 2, h2: bool = False
) -> Sample:
    """Latency at a fixed request rate below saturation: h2load ``--rps`` paces each connection at
    rate/conns requests per second; latencies come from its per-request log (time from the request being
    sent to the full response). Value: p99 in ms; p50 and p99.9 in the detail. ``h2``: over HTTP/2 (ALPN h2,
    h2load's default of one stream at a time per connection) instead of ``--h1``."""
    log.unlink(missing_ok=True)
    res = tc.run(
        [
            "h2load",
            *(() if h2 else ("--h1",)),
            "--groups",
            GROUPS,
            f"-t{threads}",
            f"-c{conns}",
            f"--rps={rate / conns:g}",
            "-D",
            f"{duration:g}",
            f"--log-file={log}",
            url,
        ],
        timeout=duration + 60,
    )
    ok, errors, non2xx = _h2load_errors(res.stdout)
    lat = []
    if log.exists():
        for line in log.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) >= 3 and parts[1].startswith("2"):
                lat.append(int(parts[2]) / 1000.0)
    if len(lat) < 100:
        return Sample(
            None,
            0,
            errors + non2xx,
            error=f"{len(lat)} timed 2xx responses ({errors} errors, {non2xx} non-2xx)"
            if res.returncode == 0
            else _failed(res, "h2load"),
        )
    q = statistics.quantiles(lat, n=1000)
    secs = _finished(res.stdout) or duration
    return Sample(
        q[989],
        ok - non2xx,
        errors + non2xx,
        {"p50_ms": statistics.median(lat), "p999_ms": q[998], "achieved_rps": (ok - non2xx) / secs},
    )


def h2load_handshakes(tc: Toolchain, url: str, n: int, threads: int = 2) -> Sample:
    """Full PQ handshakes: ``-n N -c N``, so every client makes one connection with one request and has no
    session to resume (h2load resumes on reconnect). Value: handshakes (with their request) per second."""
    res = tc.run(["h2load", "--h1", "--groups", GROUPS, f"-t{threads}", f"-n{n}", f"-c{n}", url], timeout=120)
    return _h2load_rate(res)
