"""The kernel share of one L7 keep-alive request: syscalls by kind, context switches and CPU per request of
sentin8's and nginx's workers under the same wrk load (issue 18, item 2). Not part of ``python -m bench``.

    sudo .venv/bin/python -m bench.kernel_share [--duration 5] [--repeat 3] [--conns 64] [--h2 | --h2load]
    sudo .venv/bin/python -m bench.kernel_share --l4 [--peers sentin8,haproxy,haproxy-splice]

``--h2load``: the bench's other keep-alive row, ``h2load --h1`` (the same GET, one more header: user-agent).
``--l4``: the bench's "L4 new conns" row instead (connect, ClientHello, the backend's first byte, close),
sentin8's L4 fleet beside HAProxy in TCP mode; everything is then per connection.
``--resumed``: the bench's "L7 resumed" row (a resumed PQ handshake, one proxied GET with ``Connection:
close``, the close), per connection; the client's own CPU per connection is printed beside.

The same peers as ``python -m bench`` (``bench/stack.py``: 2 pinned workers each, PQ TLS, the backend nginx
over plain HTTP keep-alive), the same ``wrk -t2 -c64`` GET / from the PQ toolchain. While wrk runs,
``perf stat`` counts, over all the workers of one peer (every thread), each syscall's ``sys_enter``
tracepoint, every syscall (``raw_syscalls:sys_enter``) and the scheduler's context switches; the workers'
voluntary and involuntary switches (``/proc/<pid>/status``) and utime + stime (``/proc/<pid>/stat``) are read
before and after. Everything is divided by the requests wrk completed. Tracepoint counting costs a few
percent, the same for both peers; ``strace -c`` would cost the traced worker ~10 times and change what it does.
A voluntary context switch is the worker going to sleep in ``epoll_wait`` with nothing to do: one wakeup.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import backends, certs, clients, loadtools, procs, stack, toolchain

SYSCALLS = (
    "read", "recvfrom", "recvmsg", "readv", "write", "sendto", "sendmsg", "writev",
    "epoll_wait", "epoll_pwait", "epoll_ctl", "futex", "getpid", "ioctl", "close", "accept4", "openat",
    "clock_gettime", "getsockopt", "setsockopt", "mmap", "munmap", "madvise", "brk",
    "socket", "connect", "splice", "shutdown", "pipe2", "fcntl", "getsockname", "getpeername",
)  # fmt: skip
EVENTS = [f"syscalls:sys_enter_{s}" for s in SYSCALLS] + ["raw_syscalls:sys_enter", "context-switches"]


def _switches(pids: list[int]) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of every thread of ``pids``."""
    vol = inv = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                for line in (task / "status").read_text().splitlines():
                    if line.startswith("voluntary_ctxt_switches"):
                        vol += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        inv += int(line.split()[1])
    return vol, inv


def _load(tc: toolchain.Toolchain, url: str, conns: int, duration: float, h2: bool | str, l4: bytes = b""):
    if h2 == "resumed":  # the bench's resumed row: fresh tickets each time (made outside the CPU window)
        port = int(url.rsplit(":", 1)[1].rstrip("/"))
        return clients.resumed_handshakes(port, "bench.test", _tickets[port], stack.BODY, duration, 2)
    if l4:  # the bench's l4_connrate: ``l4`` is the ClientHello each new connection sends
        return clients.l4_connrate(int(url.rsplit(":", 1)[1].rstrip("/")), l4, duration)
    if h2 == "h1":  # the bench's l7_h2load: h2load --h1 keep-alive
        return loadtools.h2load_keepalive(tc, url, conns, duration)
    if h2:  # the bench's l7_h2_m10: 16 connections x 10 streams
        return loadtools.h2load_streams(tc, url, 16, 10, duration)
    return loadtools.wrk(tc, url, conns, duration)


_tickets: dict[int, tuple] = {}  # the resumed row's sessions, per port: each load leaves its loops' last tickets


def measure(
    tc: toolchain.Toolchain,
    port: int,
    workers: list[int],
    conns: int,
    duration: float,
    h2: bool | str = False,
    record: str = "",
    l4: bytes = b"",
) -> dict:
    """One wrk run (h2load -m10 when ``h2``, h2load --h1 when it is "h1") against ``port`` with perf counting
    on ``workers``: per-request figures."""
    url = f"https://bench.test:{port}/"
    if h2 == "resumed":
        _tickets[port] = clients.ticket_sessions(port, "bench.test", conns)
    _load(tc, url, conns, 1.0, h2, l4)  # warm: handshakes done, buffers grown
    perf = subprocess.Popen(
        ["perf", "stat", "-x", ",", "-e", ",".join(EVENTS), "-p", ",".join(map(str, workers))],
        stderr=subprocess.PIPE,
        text=True,
    )
    rec = None
    if record:  # where the kernel time goes: cpu-clock samples with call chains, kernel and user
        argv = ["perf", "record", "-q", "-e", "cpu-clock", "-F", "999", "-g", "-o", record]
        rec = subprocess.Popen([*argv, "-p", ",".join(map(str, workers))], stderr=subprocess.DEVNULL)
    time.sleep(0.3)  # perf attached
    c0, s0 = procs.cpu_split(workers), _switches(workers)
    sample = _load(tc, url, conns, duration, h2, l4)
    c1, s1 = procs.cpu_split(workers), _switches(workers)
    perf.send_signal(signal.SIGINT)
    _, err = perf.communicate(timeout=30)
    if rec is not None:
        rec.send_signal(signal.SIGINT)
        rec.wait(60)
    if sample.value is None or not sample.count:
        raise RuntimeError(f"load failed: {sample.error}")
    n = sample.count
    counts: dict[str, float] = {}
    for line in err.splitlines():
        parts = line.split(",")
        if len(parts) > 2 and parts[0].strip().isdigit():
            counts[parts[2].removeprefix("syscalls:sys_enter_")] = int(parts[0]) / n
    return {
        "req_s": sample.value,
        "requests": n,
        "cpu_us": (c1[0] + c1[1] - c0[0] - c0[1]) / n * 1e6,
        "user_us": (c1[0] - c0[0]) / n * 1e6,
        "kernel_us": (c1[1] - c0[1]) / n * 1e6,
        "minor_faults": (c1[2] - c0[2]) / n,
        "voluntary": (s1[0] - s0[0]) / n,
        "involuntary": (s1[1] - s0[1]) / n,
        "errors": sample.errors,
        "client_cpu_us": (sample.detail or {}).get("client_cpu_ms_per_hs", 0.0) * 1e3,
        **counts,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--conns", type=int, default=64)
    ap.add_argument("--peers", default="sentin8,nginx")
    ap.add_argument("--record", default="", help="perf record the first repeat of each peer: <prefix>-<peer>.data")
    ap.add_argument("--h2", action="store_true", help="h2load -c16 -m10 over HTTP/2 instead of wrk")
    ap.add_argument("--h2load", action="store_true", help="h2load --h1 keep-alive (l7_h2load) instead of wrk")
    ap.add_argument("--l4", action="store_true", help="new L4 connections (sentin8, haproxy, haproxy-splice)")
    ap.add_argument("--resumed", action="store_true", help="resumed PQ handshakes, one GET each (--conns loops)")
    a = ap.parse_args()
    load = "resumed" if a.resumed else "h1" if a.h2load else a.h2
    work = Path(tempfile.mkdtemp(prefix="sentin8-kshare-"))
    tc = toolchain.ensure(work, log=sys.stderr)
    cert = certs.write_mldsa65(work / "cert", ["bench.test", "*.bench.test"])
    nofile = stack.rlimit_nofile()
    backend = stack.start_backend_nginx(tc, work, cert, nofile)
    http = backend.extra["http"]
    hello = b""
    first_byte = None
    if a.l4:
        from tests.hellos import pq_hello  # real ClientHello bytes from a real PQ TLS stack

        hello = pq_hello("rate.bench.test")
        first_byte = backends.start("first_byte", stack.BACKEND_CPU, len(hello))
    l4_routes = {"rate": first_byte.port} if first_byte else {}
    routes = stack.Routes(l4_routes, http, backend.extra["tls"], http, http)  # no WebSocket here: any valid port
    peers: dict[str, stack.Peer] = {}
    started: list[stack.Peer] = []  # everything to stop: sentin8's L4 and L7 fleets both, whichever is measured
    names = a.peers.split(",") if a.peers != "sentin8,nginx" or not a.l4 else ["sentin8", "haproxy"]
    try:
        for name in names:
            if name == "sentin8":
                fleet = stack.start_sentin8(work, cert, routes)
                started += [fleet, fleet.extra["l7"]]
                peers[name] = fleet if a.l4 else fleet.extra["l7"]
            elif name == "nginx":
                peers[name] = stack.start_nginx(tc, work, cert, routes, nofile)
            elif name in ("haproxy", "haproxy-splice"):
                peers[name] = stack.start_haproxy(tc, work, cert, routes, splice=name == "haproxy-splice")
        rows: dict[str, list[dict]] = {n: [] for n in peers}
        for rep in range(a.repeat):
            order = list(peers)[rep % len(peers) :] + list(peers)[: rep % len(peers)]
            for name in order:
                p = peers[name]
                record = f"{a.record}-{name}.data" if a.record and rep == 0 else ""
                port = p.l4_port if a.l4 else p.l7_port
                r = measure(tc, port, p.worker_pids(), a.conns, a.duration, load, record, hello)
                rows[name].append(r)
                total = r.get("raw_syscalls:sys_enter", 0)
                unit = "conn" if a.l4 or a.resumed else "req"
                cost = f"{r['cpu_us']:6.1f} CPU-µs/{unit}  syscalls {total:.2f}/{unit}"
                line = f"{name:8} {r['req_s']:8.0f} {unit}/s  {cost}"
                print(line, file=sys.stderr, flush=True)
        keys = ["req_s", "cpu_us", "user_us", "kernel_us", "client_cpu_us", "minor_faults", "raw_syscalls:sys_enter",
                *SYSCALLS, "context-switches", "voluntary", "involuntary", "errors"]  # fmt: skip
        print(f"| per {'connection' if a.l4 or a.resumed else 'request'} | " + " | ".join(peers) + " |")
        print("|---|" + "---|" * len(peers))
        for k in keys:
            vals = [statistics.median(r.get(k, 0.0) for r in rows[n]) for n in peers]
            if k not in ("req_s", "cpu_us", "errors") and all(v < 0.005 for v in vals):
                continue
            print(f"| {k} | " + " | ".join(f"{v:,.0f}" if v >= 100 else f"{v:.3f}" for v in vals) + " |")
    finally:
        for p in [*started, *peers.values()]:
            with contextlib.suppress(Exception):
                p.stop()
        with contextlib.suppress(Exception):
            backend.stop()
        if first_byte is not None:
            first_byte.stop()


if __name__ == "__main__":
    main()
