"""Side-by-side load tests: sentin8 beside nginx, HAProxy and the direct path, all speaking PQ TLS.

    sudo .venv/bin/python -m bench [--duration 3] [--repeat 3] [--only l4_bulk,ws_l4]

Builds (once, cached in /var/cache/sentin8-bench) a Debian 13 tree whose wrk, h2load, nginx and HAProxy link
OpenSSL 3.5, starts every peer with the same routes, certificate and worker count, runs each scenario against
each peer ``--repeat`` times (interleaved, so a load spike hits all peers alike), and writes
``bench/results/<date>.md`` with the medians, the CPU each peer spent per unit, the errors, and a PNG chart.
See bench/README.md. Needs root (chroot, private mount namespaces). Load goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import backends, certs, clients, loadtools, pqtls, procs, report, stack, toolchain
from bench.clients import Sample
from bench.report import Cell, Scenario

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


def log(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


# issue 17: HTTP/2 at the edge vs nginx, HAProxy
H2_SCENARIOS = ("l7_h2_m10", "l7_h2_m100", "page_h2", "page_h1", "latency_h2")


def scenarios(a: argparse.Namespace) -> list[Scenario]:
    l4 = ("sentin8", "nginx", "haproxy", "haproxy-splice", "direct")
    l7 = ("sentin8", "nginx", "haproxy", "direct")
    d = f"{a.duration:g} s"
    return [
        Scenario(
            "l4_bulk_1",
            "L4 bulk, 1 conn",
            "GB/s",
            True,
            "CPU-s/GB",
            1e9,
            l4,
            f"a client sends a PQ ClientHello (SNI bulk.bench.test), then reads the Python backend's zeros as "
            f"fast as it can for {d}; the proxy peeks the hello, routes on SNI and pipes raw bytes",
        ),
        Scenario(
            "l4_bulk_32",
            "L4 bulk, 32 conns",
            "GB/s",
            True,
            "CPU-s/GB",
            1e9,
            l4,
            f"the same with 32 concurrent connections (one client thread each), {d}",
        ),
        Scenario(
            "l4_connrate",
            "L4 new conns",
            "conn/s",
            True,
            "CPU-µs/conn",
            1e6,
            l4,
            f"2 client processes x {a.conn_concurrency} loops: connect, send the ClientHello, read the "
            f"backend's first byte, close, {d}: peek + routing + upstream connect + first byte",
        ),
        Scenario(
            "l7_wrk",
            f"L7 keep-alive, wrk ({a.l7_conns} conns)",
            "req/s",
            True,
            "CPU-µs/req",
            1e6,
            l7,
            f"wrk -t2 -c{a.l7_conns} -d{a.duration:g}s, GET / (63-byte body), PQ TLS at the peer, HTTP/1.1 keep-alive "
            "to the backend nginx; direct = the backend nginx terminating PQ TLS itself (1 worker)",
        ),
        Scenario(
            "l7_h2load",
            f"L7 keep-alive, h2load --h1 ({a.l7_conns} conns)",
            "req/s",
            True,
            "CPU-µs/req",
            1e6,
            l7,
            f"h2load --h1 -t2 -c{a.l7_conns} -D {a.duration:g}, same request and paths",
        ),
        Scenario(
            "l7_h2_m10",
            "L7 h2, 16 conns x 10 streams",
            "req/s",
            True,
            "CPU-µs/req",
            1e6,
            l7,
            f"h2load -t2 -c16 -m10 -D {a.duration:g} (HTTP/2 by ALPN), GET /, HTTP/1.1 keep-alive to the backend",
        ),
        Scenario(
            "l7_h2_m100",
            "L7 h2, 16 conns x 100 streams",
            "req/s",
            True,
            "CPU-µs/req",
            1e6,
            l7,
            f"h2load -t2 -c16 -m100 -D {a.duration:g}: the concurrency cap (100) full on every connection",
        ),
        Scenario(
            "page_h2",
            "Page of 20 objects, h2 on 1 conn",
            "ms",
            False,
            "CPU-ms/page",
            1e3,
            l7,
            "h2load -n20 -c1 -m20, repeated for the duration: one PQ handshake, 20 concurrent streams; ms per page",
        ),
        Scenario(
            "page_h1",
            "Page of 20 objects, h1 on 6 conns",
            "ms",
            False,
            "CPU-ms/page",
            1e3,
            l7,
            "h2load --h1 -n20 -c6, repeated: six PQ handshakes (a browser's per-origin limit), one request at a "
            "time on each; ms per page",
        ),
        Scenario(
            "latency",
            f"L7 latency at {a.rate:,} req/s (p50 / p99 / p99.9)",
            "ms",
            False,
            "CPU-µs/req",
            1e6,
            l7,
            f"h2load --h1 --rps: {a.latency_conns} connections each paced at {a.rate // a.latency_conns} "
            f"req/s for {a.latency_duration:g} s (open loop per connection, measured from each request's send "
            "to its full response, from h2load's per-request log); the ratio is on p99",
        ),
        Scenario(
            "latency_h2",
            f"L7 h2 latency at {a.rate:,} req/s (p50 / p99 / p99.9)",
            "ms",
            False,
            "CPU-µs/req",
            1e6,
            l7,
            f"the same over HTTP/2 (ALPN h2): h2load --rps, {a.latency_conns} connections, one stream at a time "
            f"each, paced at {a.rate // a.latency_conns} req/s for {a.latency_duration:g} s; the ratio is on p99",
        ),
        Scenario(
            "handshakes",
            "L7 full PQ handshakes",
            "hs/s",
            True,
            "CPU-ms/hs",
            1e3,
            l7,
            f"h2load --h1 -n {a.handshakes} -c {a.handshakes}: every client makes one connection and one "
            "request, so no session is resumed (h2load resumes when a client reconnects); X25519MLKEM768 "
            "+ ML-DSA-65, started as one burst",
        ),
        Scenario(
            "resumed",
            "L7 resumed PQ handshakes",
            "hs/s",
            True,
            "CPU-ms/hs",
            1e3,
            l7,
            f"2 client processes x {a.resumed_conns // 2} connection loops (pyOpenSSL, multiplexed) for {d}: each "
            "loop got one ticket from a full handshake before the clock, then connects again and again with SNI "
            "bench.test, X25519MLKEM768 only, resuming its latest TLS 1.3 ticket (psk_dhe_ke), and makes one "
            "GET / with Connection: close that every peer proxies to the backend, read to the server's close; "
            "connections land on either worker, so shared ticket keys are what keeps them resumed. Counted: "
            "resumed connections with the backend's 200 and body only; a full handshake is an error",
        ),
        Scenario(
            "ws_l7",
            "WebSocket echo RTT via L7",
            "µs",
            False,
            "CPU-µs/rt",
            1e6,
            l7,
            f"one warmed client (500 round trips first), closed loop, 32-byte messages for {d}: wss to the "
            "peer, which terminates PQ TLS and upgrades to the plain echo backend; direct = the same client "
            "over plain ws to the echo backend (the client floor)",
        ),
        Scenario(
            "ws_l4",
            "WebSocket echo RTT via L4",
            "µs",
            False,
            "CPU-µs/rt",
            1e6,
            l4,
            "the same, but through the SNI-routed L4 pipe: the echo backend terminates PQ TLS itself; "
            "direct = the same wss client straight to that backend (the client floor)",
        ),
        Scenario(
            "mem_l4",
            "Memory, idle L4 conns",
            "KiB/conn",
            False,
            "",
            1.0,
            ("sentin8", "nginx", "haproxy", "haproxy-splice"),
            "a freshly started peer (one probe connection served): its workers' RSS idle, then holding N "
            "connections that each sent a ClientHello and were piped to a sink backend (N in Run); value: "
            "(loaded - idle) / connections established. RSS only: kernel socket buffers and splice pipes are "
            "not in it",
        ),
        Scenario(
            "mem_l7",
            "Memory, idle keep-alive L7 conns",
            "KiB/conn",
            False,
            "",
            1.0,
            ("sentin8", "nginx", "haproxy"),
            "the same with N PQ TLS connections that each made one keep-alive GET and then idle (a "
            "multiplexed pyOpenSSL client, 128 full handshakes in flight)",
        ),
        Scenario(
            "mem_h2",
            "Memory, idle h2 conns",
            "KiB/conn",
            False,
            "",
            1.0,
            ("sentin8", "nginx", "haproxy"),
            "the same over HTTP/2: each connection offers only ALPN h2, ACKs the server's SETTINGS, makes one "
            "GET on stream 1 and then idles",
        ),
    ]


class Bench:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.cells: dict[tuple[str, str], Cell] = {}
        self.peers: dict[str, stack.Peer] = {}
        self.l7: dict[str, stack.Peer] = {}
        self.bk: dict[str, backends.Backend] = {}
        self.backend_nginx: stack.Peer | None = None
        self.notes: list[str] = []
        self.hellos: dict[str, bytes] = {}

    # ---- setup ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        from tests.hellos import pq_hello  # real ClientHello bytes from a real PQ TLS stack

        a = self.a
        self.nofile = stack.rlimit_nofile()
        # every proxy must hold them all: HAProxy's one process needs 2 fds per proxied connection
        self.idle_conns = min(a.idle_conns, stack.haproxy_maxconn(splice=True) - 100)
        if self.idle_conns < a.idle_conns:
            self.notes.append(
                f"idle connections capped at {self.idle_conns:,} (asked {a.idle_conns:,}): RLIMIT_NOFILE is "
                f"{self.nofile:,} here and cannot be raised (no CAP_SYS_RESOURCE), and HAProxy's single process "
                "needs 2 fds per proxied connection (+ its splice pipes)"
            )
        self.work = Path(tempfile.mkdtemp(prefix="sentin8-bench-"))
        self.tc = toolchain.ensure(self.work, log=sys.stderr, force_chroot=a.force_chroot)
        self.cert = certs.write_mldsa65(self.work / "cert", ["bench.test", "*.bench.test"])
        for name in stack.L4_NAMES:
            self.hellos[name] = pq_hello(f"{name}.bench.test")
        # forked before this process starts any thread
        self.bk = {
            "bulk": backends.start("bulk", stack.BACKEND_CPU, len(self.hellos["bulk"])),
            "first_byte": backends.start("first_byte", stack.BACKEND_CPU, len(self.hellos["rate"])),
            "sink": backends.start("sink", stack.BACKEND_CPU),
            "ws_plain": backends.start("ws_plain", stack.BACKEND_CPU),
            "ws_tls": backends.start("ws_tls", stack.BACKEND_CPU, cert=str(self.cert.cert), key=str(self.cert.key)),
        }
        self.backend_nginx = stack.start_backend_nginx(self.tc, self.work, self.cert, self.nofile)
        self.routes = stack.Routes(
            l4={
                "bulk": self.bk["bulk"].port,
                "rate": self.bk["first_byte"].port,
                "sink": self.bk["sink"].port,
                "ws": self.bk["ws_tls"].port,
            },
            backend_http=self.backend_nginx.extra["http"],
            backend_tls=self.backend_nginx.extra["tls"],
            ws_plain=self.bk["ws_plain"].port,
            ws_tls=self.bk["ws_tls"].port,
        )
        self.starters: dict[str, Callable[[], stack.Peer]] = {
            "sentin8": lambda: stack.start_sentin8(self.work, self.cert, self.routes),
            "nginx": lambda: stack.start_nginx(self.tc, self.work, self.cert, self.routes, self.nofile),
            "haproxy": lambda: stack.start_haproxy(self.tc, self.work, self.cert, self.routes, splice=False),
            "haproxy-splice": lambda: stack.start_haproxy(self.tc, self.work, self.cert, self.routes, splice=True),
        }
        self.start_errors: dict[str, str] = {}
        for name in self.starters:
            self.launch(name)
        log("peers: " + ", ".join(f"{n} l4={p.l4_port} l7={p.l7_port}" for n, p in self.peers.items()))

    def launch(self, name: str) -> stack.Peer | None:
        """Start (or restart) one peer; a peer that cannot start fails its cells, not the run."""
        old = self.peers.pop(name, None)
        self.l7.pop(name, None)
        if old is not None:
            old.stop()
            if name == "sentin8":
                old.extra["l7"].stop()
        try:
            peer = self.starters[name]()
        except Exception as exc:
            self.start_errors[name] = f"did not start: {exc}"[:200]
            log(f"{name} {self.start_errors[name]}")
            return None
        self.peers[name] = peer
        if name == "sentin8":
            self.l7["sentin8"] = peer.extra["l7"]
        elif peer.l7_port:
            self.l7[name] = peer
        return peer

    def stop(self) -> None:
        if "sentin8" in self.peers:
            with contextlib.suppress(Exception):
                self.peers["sentin8"].extra["l7"].stop()
        for peer in [*self.peers.values(), self.backend_nginx]:
            if peer is not None:
                with contextlib.suppress(Exception):
                    peer.stop()
        for b in self.bk.values():
            b.stop()

    # ---- probes ---------------------------------------------------------------------------------------------

    def probe_l7(self, port: int, sni: str = "bench.test") -> str:
        """'' when a PQ TLS GET / answers 200 with the backend's body, else why not."""
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                conn = pqtls.client(s, sni, timeout=5)
                group = pqtls.negotiated_group(conn)
                conn.sendall(f"GET / HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n".encode())
                data = b""
                with contextlib.suppress(Exception):
                    while chunk := conn.recv(65536):
                        data += chunk
        except Exception as exc:
            return f"L7 probe failed: {type(exc).__name__}: {exc}"[:160]
        if not data.startswith(b"HTTP/1.1 200") or stack.BODY not in data:
            return f"L7 probe: unexpected answer {data[:40]!r}"
        if group != "X25519MLKEM768":
            return f"L7 probe: negotiated {group}, not X25519MLKEM768"
        return ""

    def probe_l4(self, port: int) -> str:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(self.hellos["bulk"])
                if not s.recv(1):
                    return "L4 probe: closed without data"
        except OSError as exc:
            return f"L4 probe failed: {exc}"[:160]
        return ""

    # ---- measuring -----------------------------------------------------------------------------------------

    def measure(self, sc: Scenario, peer: str, pids: list[int], fn: Callable[[], Sample]) -> None:
        cell = self.cells.setdefault((sc.key, peer), Cell())
        if cell.skipped:
            return
        c0 = procs.cpu_seconds(pids)
        try:
            sample = fn()
        except Exception as exc:  # one broken cell must not end the run
            sample = Sample(None, 0, 1, error=f"{type(exc).__name__}: {exc}"[:160])
        cpu = procs.cpu_seconds(pids) - c0
        cell.samples.append(sample)
        if sample.value is not None and sample.count and sc.cpu_unit:
            cell.cpu.append(cpu / sample.count * sc.cpu_scale)
        shown = "n/a (" + sample.error + ")" if sample.value is None else f"{sample.value:.4g} {sc.unit}"
        log(f"  {sc.key:<12} {peer:<15} {shown}" + (f"  errors={sample.errors}" if sample.errors else ""))

    def skip(self, sc: Scenario, peer: str, why: str) -> None:
        self.cells.setdefault((sc.key, peer), Cell()).skipped = why

    def targets(self, sc: Scenario) -> list[tuple[str, int, list[int]]]:
        """(peer, port, pids to charge) for each peer of the scenario that can run it."""
        out = []
        direct = self._direct(sc)
        for name in sc.peers:
            if self.a.peers and name not in self.a.peers.split(","):
                continue
            if name == "direct":
                if direct is not None:
                    out.append(("direct", *direct))
                continue
            l7 = sc.key in (*H2_SCENARIOS, "l7_wrk", "l7_h2load", "latency", "handshakes", "resumed", "ws_l7")
            l7 = l7 or sc.key in ("mem_l7", "mem_h2")
            peer = (self.l7 if l7 else self.peers).get(name)
            if peer is None:
                self.skip(sc, name, self.start_errors.get(name, "not started"))
                continue
            why = self.probes.get((name, "l7" if l7 else "l4"), "")
            if why:
                self.skip(sc, name, why)
                continue
            out.append((name, peer.l7_port if l7 else peer.l4_port, peer.pids()))
        return out

    def _direct(self, sc: Scenario) -> tuple[int, list[int]] | None:
        bn = self.backend_nginx
        table = {
            "l4_bulk_1": self.bk["bulk"],
            "l4_bulk_32": self.bk["bulk"],
            "l4_connrate": self.bk["first_byte"],
            "ws_l7": self.bk["ws_plain"],
            "ws_l4": self.bk["ws_tls"],
        }
        if sc.key in table:
            b = table[sc.key]
            return b.port, [b.proc.pid]
        if sc.key in (*H2_SCENARIOS, "l7_wrk", "l7_h2load", "latency", "handshakes", "resumed") and bn is not None:
            return bn.extra["tls"], bn.pids()
        return None

    def run_scenario(self, sc: Scenario) -> None:
        t0 = time.monotonic()
        try:
            self._run_scenario(sc)
        finally:
            sc.seconds = time.monotonic() - t0

    def _run_scenario(self, sc: Scenario) -> None:
        a = self.a
        targets = self.targets(sc)
        log(f"{sc.title}: {', '.join(t[0] for t in targets) or 'nothing to run'}")
        for rep in range(a.repeat if not sc.key.startswith("mem") else a.mem_repeat):
            # rotate the order each repeat: no peer always runs right after the same neighbour
            order = targets[rep % max(1, len(targets)) :] + targets[: rep % max(1, len(targets))]
            for name, port, pids in order:
                self.measure(sc, name, pids, self._runner(sc, name, port))

    def _runner(self, sc: Scenario, peer: str, port: int) -> Callable[[], Sample]:
        a, tc = self.a, self.tc
        url = f"https://bench.test:{port}/"
        k = sc.key
        if k == "l4_bulk_1":
            return lambda: clients.l4_bulk(port, self.hellos["bulk"], 1, a.duration)
        if k == "l4_bulk_32":
            return lambda: clients.l4_bulk(port, self.hellos["bulk"], 32, a.duration)
        if k == "l4_connrate":
            return lambda: clients.l4_connrate(port, self.hellos["rate"], a.duration, 2, a.conn_concurrency)
        if k == "l7_wrk":
            return lambda: loadtools.wrk(tc, url, a.l7_conns, a.duration)
        if k == "l7_h2load":
            return lambda: loadtools.h2load_keepalive(tc, url, a.l7_conns, a.duration)
        if k in ("l7_h2_m10", "l7_h2_m100"):
            return lambda: loadtools.h2load_streams(tc, url, 16, 10 if k == "l7_h2_m10" else 100, a.duration)
        if k in ("page_h2", "page_h1"):
            return lambda: loadtools.page_loads(tc, url, 20, k == "page_h2", a.duration)
        if k in ("latency", "latency_h2"):
            return lambda: loadtools.h2load_latency(
                tc, url, a.rate, a.latency_conns, a.latency_duration, self.work / f"{k}-{peer}.log", h2=k != "latency"
            )
        if k == "handshakes":
            return lambda: loadtools.h2load_handshakes(tc, url, a.handshakes)
        if k == "resumed":
            # the full handshakes that give each connection loop its first ticket: made here, before
            # measure() opens the CPU window, so inside it every connection should resume
            try:
                tickets = clients.ticket_sessions(port, "bench.test", a.resumed_conns)
            except Exception as exc:
                failed = Sample(None, 0, 1, error=f"no ticket: {type(exc).__name__}: {exc}"[:160])
                return lambda: failed
            return lambda: clients.resumed_handshakes(port, "bench.test", tickets, stack.BODY, a.duration, 2)
        if k == "ws_l7":
            return lambda: clients.ws_echo(port, "ws.bench.test", peer != "direct", a.duration)
        if k == "ws_l4":
            return lambda: clients.ws_echo(port, "ws.bench.test", True, a.duration)
        if k == "mem_l4":
            return lambda: self.memory(peer, l7=False)
        if k in ("mem_l7", "mem_h2"):
            return lambda: self.memory(peer, l7=True, h2=k == "mem_h2")
        raise ValueError(k)

    def memory(self, name: str, l7: bool, h2: bool = False) -> Sample:
        """RSS of a freshly started peer's workers, idle and then holding N connections.

        Fresh, because allocators keep what earlier scenarios (and repeats) grew: against a warm process the
        idle figure includes buffers the loaded one merely reuses, and per-connection cost reads near zero."""
        if self.launch(name) is None:
            return Sample(None, 0, 1, error=self.start_errors.get(name, "did not restart"))
        peer = (self.l7 if l7 else self.peers)[name]
        port = peer.l7_port if l7 else peer.l4_port
        why = self.probe_l7(port) if l7 else self.probe_l4(port)  # one connection, as a live worker has seen
        if why:
            return Sample(None, 0, 1, error=why)
        time.sleep(1.0)
        workers = peer.worker_pids()
        n = self.idle_conns
        sink = self.bk["sink"].count
        base = sink.value
        idle = procs.rss_bytes(workers)
        t0 = time.monotonic()
        if l7:
            held, errors = clients.hold_l7(port, "bench.test", n, h2=h2)
            established = len(held)  # each one had its response: the peer holds it
        else:
            held, errors = clients.hold_l4(port, self.hellos["sink"], n)
            # the proxy connects upstream asynchronously: wait until the sink holds them all, or stops gaining
            last, last_change = -1, time.monotonic()
            while (established := sink.value - base) < len(held) and time.monotonic() - last_change < 3:
                if established != last:
                    last, last_change = established, time.monotonic()
                time.sleep(0.05)
            errors += len(held) - established  # accepted by the peer but never piped to the backend
        setup = time.monotonic() - t0
        time.sleep(0.5)
        loaded = procs.rss_bytes(workers)
        clients.close_all(held)
        deadline = time.monotonic() + 30
        while not l7 and sink.value > base and time.monotonic() < deadline:
            time.sleep(0.05)
        if not established:
            return Sample(None, 0, errors, error="no connection established")
        if errors:
            why = f"{errors} of {n} connections not established"
            if not l7 and peer.fleet is not None and "Too many open files" in peer.fleet.output():
                why += " (EMFILE in the workers' log)"
            self.cells[("mem_h2" if h2 else "mem_l7" if l7 else "mem_l4", name)].notes.add(why)
        return Sample(
            (loaded - idle) / established / 1024,
            established,
            errors,
            {"idle_mib": idle / 2**20, "loaded_mib": loaded / 2**20, "held": established, "setup_s": setup},
        )

    # ---- the run ------------------------------------------------------------------------------------------

    def run(self) -> None:
        self.probes: dict[tuple[str, str], str] = {}
        for name, peer in self.peers.items():
            if peer.l4_port:
                self.probes[(name, "l4")] = self.probe_l4(peer.l4_port)
        for name, peer in self.l7.items():
            why = self.probe_l7(peer.l7_port)
            if why and peer.fleet is not None:
                with contextlib.suppress(Exception):
                    refused = peer.fleet.stats().get("external_refused", 0)
                    if refused:
                        why += f"; the fleet counted external_refused={refused}: its L7 path is not wired yet"
            self.probes[(name, "l7")] = why
        for key, why in self.probes.items():
            if why:
                log(f"probe {key}: {why}")
        for sc in self.selected:
            self.run_scenario(sc)


def machine() -> dict[str, str]:
    cpu = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        m = re.search(r"model name\s*:\s*(.*)", fh.read())
        cpu = m[1] if m else cpu
    mem = ""
    with contextlib.suppress(OSError), open("/proc/meminfo") as fh:
        mem = f"{int(fh.readline().split()[1]) / 2**20:.1f} GiB RAM"
    debian = Path("/etc/debian_version").read_text().strip() if Path("/etc/debian_version").exists() else "?"
    return {
        "machine": f"{cpu}, {os.cpu_count()} CPUs, {mem}; kernel {platform.release()}; Debian {debian} host",
        "python": f"{platform.python_version()} ({sys.executable})",
    }


def git_state() -> str:
    def q(*args: str) -> str:
        res = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return res.stdout.strip()

    head = q("rev-parse", "--short", "HEAD") or "unknown"
    dirty = q("status", "--porcelain", "--untracked-files=no")
    return f"{head}" + (" with uncommitted changes" if dirty else "")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=2.0, help="seconds per measurement (default 2)")
    ap.add_argument(
        "--latency-duration", type=float, default=4.0, help="seconds per latency measurement (default 4: p99.9)"
    )
    ap.add_argument("--repeat", type=int, default=3, help="repeats per cell; the median is reported (default 3)")
    ap.add_argument("--mem-repeat", type=int, default=3, help="repeats of the memory scenarios (default 3)")
    ap.add_argument("--l7-conns", type=int, default=64, help="keep-alive connections for wrk and h2load")
    ap.add_argument("--rate", type=int, default=1000, help="total req/s of the latency scenario (default 1000)")
    ap.add_argument("--latency-conns", type=int, default=10, help="connections of the latency scenario")
    ap.add_argument("--handshakes", type=int, default=2000, help="connections of the handshake scenario")
    ap.add_argument("--resumed-conns", type=int, default=32, help="connection loops (2 processes), resumed scenario")
    ap.add_argument("--conn-concurrency", type=int, default=32, help="loops per process, new-connection scenario")
    ap.add_argument("--idle-conns", type=int, default=10_000, help="idle connections of the memory scenarios")
    ap.add_argument("--only", default="", help="comma-separated scenario keys (default: all)")
    ap.add_argument("--peers", default="", help="comma-separated peers to measure (default: every peer)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the report goes (default bench/results)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run (~2 min): 1 s, 1 repeat, 2,000 idle connections; writes <date>-quick.md",
    )
    ap.add_argument(
        "--name", default="", help="a suffix for the report's files: --name h2 writes <date>-h2.md/.json/.png"
    )
    ap.add_argument("--keep", action="store_true", help="keep the work dir (configs, logs) for a look afterwards")
    ap.add_argument("--force-chroot", action="store_true", help="use the Debian 13 tree even on a PQ-capable host")
    a = ap.parse_args(argv)
    if a.quick:
        a.duration, a.latency_duration, a.repeat, a.mem_repeat = 1.0, 1.0, 1, 1
        a.idle_conns, a.handshakes = min(a.idle_conns, 2000), min(a.handshakes, 500)
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if os.geteuid() != 0:
        print("bench: needs root (chroot and private mount namespaces for the PQ toolchain)", file=sys.stderr)
        return 2
    started = dt.datetime.now(dt.UTC)
    t0, busy0, ours0 = time.monotonic(), procs.machine_busy_seconds(), procs.cpu_seconds_with_reaped(os.getpid())
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    b = Bench(a)
    all_sc = scenarios(a)
    keys = {k.strip() for k in a.only.split(",") if k.strip()}
    unknown = keys - {s.key for s in all_sc}
    if unknown:
        print(f"bench: unknown scenario(s) {sorted(unknown)}; known: {[s.key for s in all_sc]}", file=sys.stderr)
        return 2
    b.selected = [s for s in all_sc if not keys or s.key in keys]
    try:
        b.start()
        b.run()
    finally:
        b.stop()
    wall = time.monotonic() - t0
    busy = procs.machine_busy_seconds() - busy0
    ours = procs.cpu_seconds_with_reaped(os.getpid()) - ours0
    load1 = Path("/proc/loadavg").read_text().split()[:3]
    foreign = max(0.0, busy - ours)
    capacity = wall * (os.cpu_count() or 1)

    date = started.strftime("%Y-%m-%d")
    a.out.mkdir(parents=True, exist_ok=True)
    stem = date + (f"-{a.name}" if a.name else "") + ("-quick" if a.quick else "")
    md, png, js = a.out / f"{stem}.md", a.out / f"{stem}.png", a.out / f"{stem}.json"
    tc = b.tc
    build = (
        f"built by this run in {tc.build_seconds:.0f} s"
        if tc.build_seconds
        else ("cached" if tc.root is not None else "host tools (host OpenSSL is 3.5+)")
    )
    run = {
        **machine(),
        "sentin8": f"git {git_state()}",
        "toolchain": f"{tc.versions.get('chroot', 'host')}; {build}",
        "versions": "; ".join(f"{k}: {v}" for k, v in tc.versions.items() if k != "chroot"),
        "TLS everywhere": "TLS 1.3 only, X25519MLKEM768 only, one self-signed ML-DSA-65 certificate "
        "(cryptography) on every terminator: nginx ssl_ecdh_curve X25519MLKEM768, HAProxy curves X25519MLKEM768, "
        "sentin8 as designed, the backends",
        "pinning": stack.environment_pins() + "; " + "; ".join(f"{n}: {p.note}" for n, p in b.peers.items() if p.note),
        "timing": f"{a.duration:g} s per measurement (latency {a.latency_duration:g} s), {a.repeat} repeats "
        f"(memory {a.mem_repeat}), median reported; peers interleaved within each repeat; whole run {wall:.0f} s"
        + (" (--quick: a smoke run, not numbers to quote)" if a.quick else ""),
        "idle connections": f"{b.idle_conns:,} (RLIMIT_NOFILE {b.nofile:,})",
        "machine load": f"loadavg {' '.join(load0)} at start, {' '.join(load1)} at end; processes outside this "
        f"run used {foreign:.0f} CPU-s of {capacity:.0f} available ({100 * foreign / capacity:.0f}%)",
        "total errors": str(sum(c.errors for c in b.cells.values())),
    }
    warning = ""
    if foreign / capacity > 0.05:
        warning = (
            f"Other processes used {100 * foreign / capacity:.0f}% of the machine's CPU during this run: "
            "the absolute numbers are depressed and noisier; the ratios (peers measured interleaved) hold better."
        )
    sections = {"Notes": b.notes} if b.notes else {}
    meta = {"date": started.strftime("%Y-%m-%d %H:%M UTC"), "run": run, "warning": warning, "sections": sections}
    has_chart = report.chart(png, b.selected, b.cells, f"sentin8 bench {date} (relative to nginx)", sys.stderr)
    md.write_text(report.markdown(meta, b.selected, b.cells, png.name if has_chart else None))
    report.write_json(js, meta, b.cells)
    log(f"wrote {md}" + (f" and {png}" if has_chart else ""))
    print(md.read_text())
    if b.work.exists() and not a.keep:
        if tc.root is not None:
            with contextlib.suppress(OSError):
                (tc.root / str(b.work).lstrip("/")).rmdir()  # the bind-mount point made in the tree
        shutil.rmtree(b.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
