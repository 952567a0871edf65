"""Quick L7 loop for profiling sentin8 alone: backend nginx + WebSocket echo + the sentin8 L7 fleet.

    .venv/bin/python -m bench.profile.l7 --runs 3 --duration 3 [--pyspy out-prefix] [--what wrk,h2,hs,res,ws]
    .venv/bin/python -m bench.profile.l7 --what res --perf /tmp/l7.perf   # + perf record -g, one worker: l7.perf-res
    .venv/bin/python -m bench.profile.l7 --what l4 --perf /tmp/l7.perf    # the L4 fleet's new connections: -l4

Prints, per run, wrk req/s and sentin8 CPU-µs per request (``h2``: the same over HTTP/2, h2load -c16 -m10),
h2load full handshakes/s and CPU-ms per handshake, the WebSocket echo median RTT, and (``l4``) the L4 fleet's
new connections/s and CPU-µs per connection (the bench's ``l4_connrate``). Needs root (the PQ
toolchain chroot), like ``python -m bench``.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import backends, certs, clients, loadtools, procs, stack, toolchain


def _spy(out: str, pid: int) -> subprocess.Popen:
    """py-spy on one worker until _stop; text output (``--format raw``), native frames when ``out`` says so."""
    native = ["--native"] if "native" in out else ["--nonblocking"]
    argv = [str(Path(sys.executable).parent / "py-spy"), "record", "--format", "raw", "-r", "200", *native]
    proc = subprocess.Popen([*argv, "-o", f"{out}.txt", "-p", str(pid)], stdout=subprocess.DEVNULL)
    time.sleep(0.5)  # attached before the load starts
    return proc


def _perf(out: str, pid: int) -> subprocess.Popen:
    """``perf record -g`` (cpu-clock, 999 Hz) on one worker until _stop."""
    proc = subprocess.Popen(
        ["perf", "record", "-e", "cpu-clock", "-F", "999", "-g", "-o", out, "-p", str(pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.5)
    return proc


def _per_process(each: dict[int, float], pids: list[int], workers: set[int], n: int) -> str:
    """CPU-ms per unit of each fleet process: the workers ('w') beside the supervisor, resolver and mgmt."""
    return "per process " + " ".join(
        f"{'w' if pid in workers else procs.cmdline(pid).split(':')[-1].strip()[:10]}={each[pid] / n * 1e3:.3f}"
        for pid in pids
    )


def _stop(spy: subprocess.Popen | None) -> None:
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--what", default="wrk,hs,ws")
    ap.add_argument("--handshakes", type=int, default=2000)
    ap.add_argument("--pyspy", default="", help="record one worker with py-spy during the first wrk run")
    ap.add_argument("--perf", default="", help="perf record -g a worker in each first run: PATH-wrk, -h2, -hs, -res")
    a = ap.parse_args()
    what = set(a.what.split(","))
    work = Path(tempfile.mkdtemp(prefix="sentin8-prof-"))
    stack.rlimit_nofile()
    tc = toolchain.ensure(work, log=sys.stderr)
    cert = certs.write_mldsa65(work / "cert", ["bench.test", "*.bench.test"])
    ws_b = backends.start("ws_plain", stack.BACKEND_CPU)
    from tests.hellos import pq_hello  # real ClientHello bytes from a real PQ TLS stack

    hello = pq_hello("rate.bench.test")
    first_byte = backends.start("first_byte", stack.BACKEND_CPU, len(hello))
    bn = stack.start_backend_nginx(tc, work, cert, stack.rlimit_nofile())
    routes = stack.Routes(
        l4={"rate": first_byte.port},
        backend_http=bn.extra["http"],
        backend_tls=bn.extra["tls"],
        ws_plain=ws_b.port,
        ws_tls=ws_b.port,
    )
    peer = stack.start_sentin8(work, cert, routes)
    l7 = peer.extra["l7"]
    if "l4" not in what:
        peer.stop()  # the L4 fleet is not needed here
    try:
        time.sleep(1.0)
        pids = l7.pids()
        url = f"https://bench.test:{l7.l7_port}/"
        loadtools.wrk(tc, url, 64, 1.0)  # warm-up
        print("workers", *l7.worker_pids(), flush=True)
        for run in range(a.runs):
            line = [f"run {run}"]
            first = run == 0 and a.pyspy
            if "wrk" in what:
                spy = _spy(a.pyspy, l7.worker_pids()[0]) if first else None
                perf = _perf(a.perf + "-wrk", l7.worker_pids()[0]) if run == 0 and a.perf else None
                c0 = procs.cpu_seconds(pids)
                s = loadtools.wrk(tc, url, 64, a.duration)
                cpu = procs.cpu_seconds(pids) - c0
                _stop(spy)
                _stop(perf)
                first = ""
                per = cpu / max(1, s.count) * 1e6
                line.append(f"wrk {s.value or 0:8.0f} req/s {per:6.1f} CPU-us/req err={s.errors}")
            if "h2" in what:  # h2load over HTTP/2, 16 connections x 10 streams (the bench's l7_h2_m10)
                spy = _spy(a.pyspy + "-h2", l7.worker_pids()[0]) if first else None
                perf = _perf(a.perf + "-h2", l7.worker_pids()[0]) if run == 0 and a.perf else None
                c0 = procs.cpu_seconds(pids)
                s = loadtools.h2load_streams(tc, url, 16, 10, a.duration)
                cpu = procs.cpu_seconds(pids) - c0
                _stop(spy)
                _stop(perf)
                per = cpu / max(1, s.count) * 1e6
                line.append(f"h2 -m10 {s.value or 0:8.0f} req/s {per:6.1f} CPU-us/req err={s.errors}")
            if "hs" in what:
                spy = _spy(a.pyspy, l7.worker_pids()[0]) if first else None
                perf = _perf(a.perf + "-hs", l7.worker_pids()[0]) if run == 0 and a.perf else None
                each0 = {pid: procs.cpu_seconds([pid]) for pid in pids}
                c0 = procs.cpu_seconds(pids)
                s = loadtools.h2load_handshakes(tc, url, a.handshakes)
                cpu = procs.cpu_seconds(pids) - c0
                each = {pid: procs.cpu_seconds([pid]) - t for pid, t in each0.items()}
                _stop(spy)
                _stop(perf)
                line.append(f"hs {s.value or 0:6.0f}/s {cpu / max(1, s.count) * 1e3:5.2f} CPU-ms err={s.errors}")
                # where the CPU per handshake goes: workers vs the supervisor, resolver and mgmt processes
                workers = set(l7.worker_pids())
                n = max(1, s.count)
                line.append(_per_process(each, pids, workers, n))
            if "res" in what:  # the bench's resumed row: ticket resumption, one proxied GET per connection
                tickets = clients.ticket_sessions(l7.l7_port, "bench.test", 32)
                spy = _spy(a.pyspy + "-res", l7.worker_pids()[0]) if first else None
                perf = _perf(a.perf + "-res", l7.worker_pids()[0]) if run == 0 and a.perf else None
                each0 = {pid: procs.cpu_seconds([pid]) for pid in pids}
                s = clients.resumed_handshakes(l7.l7_port, "bench.test", tickets, stack.BODY, a.duration)
                each = {pid: procs.cpu_seconds([pid]) - t for pid, t in each0.items()}
                _stop(spy)
                _stop(perf)
                n = max(1, s.count)
                line.append(f"resumed {s.value or 0:6.0f}/s {sum(each.values()) / n * 1e3:5.3f} CPU-ms {s.detail}")
                workers = set(l7.worker_pids())
                line.append(_per_process(each, pids, workers, n))
            if "l4" in what:
                l4_pids = peer.pids()
                perf = _perf(a.perf + "-l4", peer.worker_pids()[0]) if run == 0 and a.perf else None
                spy = _spy(a.pyspy + "-l4", peer.worker_pids()[0]) if first else None
                c0 = procs.cpu_seconds(l4_pids)
                s = clients.l4_connrate(peer.l4_port, hello, a.duration)
                cpu = procs.cpu_seconds(l4_pids) - c0
                _stop(spy)
                _stop(perf)
                line.append(f"l4 {s.value or 0:6.0f} conn/s {cpu / max(1, s.count) * 1e6:6.1f} CPU-us err={s.errors}")
            if "ws" in what:
                s = clients.ws_echo(l7.l7_port, "ws.bench.test", True, a.duration)
                line.append(f"ws {s.value or 0:6.1f} us")
            print(" | ".join(line), flush=True)
        st = l7.fleet.stats()
        print("counters", {k: v for k, v in st.items() if k.startswith(("upstream", "handshake", "requests", "conn"))})
    finally:
        l7.stop()
        if "l4" in what:
            peer.stop()
        first_byte.stop()
        bn.stop()
        ws_b.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
