"""The data-plane process: accept on :443, peek, classify, resolve, then the L4 pipe or the L7 bridge.

Thin I/O around sentin8's sans-IO logic. One uvloop loop per process, pinned to one CPU by the supervisor.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import socket

import setproctitle
import uvloop

from sentin8 import lifecycle, routing, session_tickets, tls
from sentin8.backends import Backends
from sentin8.breaker import BreakerRules
from sentin8.certpair import ServerCert
from sentin8.certstore import CertStore, store_dirname
from sentin8.config import Config
from sentin8.eventlog import event
from sentin8.holds import Hold, OpenConnections
from sentin8.netclass import Classifier
from sentin8.policy import EdgePolicy
from sentin8.routing import RoutingTable
from sentin8.selection import Selector
from sentin8.shm.counters import WorkerCounters
from sentin8.shm.policy import PolicyCache
from sentin8.shm.snapshot import SnapshotCache
from sentin8.shm.state import SharedState
from sentin8.tls import SNIContexts

from .door import Door
from .l4_pipe import PipePool
from .l7 import PlainHTTPListener
from .l7_context import WorkerL7Context
from .listener import HTTP, HTTPS, INTERNAL_L4, Acceptor, bind_reuseport
from .poll_set import PollSet
from .socket_linger import SocketLinger
from .tls_entry import Bridges, TLSEntry, adopt


def _decode_paused_gc(data: bytes) -> RoutingTable:
    # a 10k-name table allocates ~100k objects: without this a GC pass lands mid-decode and doubles the stall
    gc.disable()
    try:
        return routing.decode(data)
    finally:
        gc.enable()


def worker_backends(cfg: Config, shared: SharedState, counters: WorkerCounters) -> Backends:
    """A worker's backend selection: the routing snapshot, the fleet's suspect marks and (``[breaker]
    enabled``) its circuit breakers, all in shared memory. Also what the keep-alive profile builds."""
    br = cfg.breaker
    breakers = shared.breakers(
        BreakerRules(br.failures, br.failure_ratio, br.min_requests, br.window_s, br.open_s, br.probe_timeout_s)
    )
    return Backends(
        SnapshotCache(shared.snapshot_reader(), _decode_paused_gc),
        Selector(shared.suspects(), cfg.sources.health_fresh_s, cfg.sources.suspect_ttl_s),
        counters,
        breakers=breakers if br.enabled else None,
        breaker_open_s=br.open_s,
    )


def worker_policy(cfg: Config, shared: SharedState) -> tuple[EdgePolicy, PolicyCache]:
    """A worker's edge policy over the fleet's rate-limit buckets, and its values: the config's [policy] with
    the runtime overlay the management API publishes in shm on top."""
    cluster = shared.cluster_status()  # cluster mode: the share of the limit while Valkey is unreachable
    policy = EdgePolicy(cfg.policy, shared.buckets(), share=(lambda: cluster.share) if shared.cluster_enabled else None)
    return policy, PolicyCache(shared.policy_reader(), cfg.policy)


class Worker:
    def __init__(self, cfg: Config, shared: SharedState, index: int, slot: int, status_fd: int) -> None:
        self.cfg = cfg
        self.index = index
        self.status_fd = status_fd
        self.counters = shared.worker_counters(slot)
        self.counters.claim(index)
        self.backends = worker_backends(cfg, shared, self.counters)
        self.conncap = shared.connection_counts(slot)
        self.classifier = Classifier(cfg.network.internal_cidrs)
        self.pipes = PipePool()
        self.policy, self.policy_values = worker_policy(cfg, shared)
        self.cert_report = shared.cert_report_writer(slot)
        self.certs = CertStore(
            cfg.tls.cert_dir,
            cfg.tls.state_dir,
            on_unusable=self._cert_rejected,
            on_loaded=self._cert_loaded,
            on_expiring=lambda _cert, _left: self.counters.inc("cert_expiring"),
        )
        self.tickets = self._ticket_sealer(shared)
        self.sni = SNIContexts(
            self.certs,
            client_ca_file=cfg.tls.client_ca_file,
            tickets=self.tickets,
            protocols=tls.H2_PROTOCOLS if cfg.http2.enabled else tls.SERVED_PROTOCOLS,
        )
        self.bridges = Bridges()
        self.listeners: list[socket.socket] = []
        self.http_listener: socket.socket | None = None
        self.internal_l4_listener: socket.socket | None = None
        self.open = OpenConnections(self.counters)  # any stage: drain waits for zero (begin_drain)
        self.draining = False
        self.loop: asyncio.AbstractEventLoop
        self.stopped: asyncio.Future[int]

    # ---- process lifecycle -------------------------------------------------------------------------

    def run(self) -> int:
        return uvloop.run(self._main())

    async def _main(self) -> int:
        self.loop = asyncio.get_running_loop()
        self.lingering = SocketLinger(self.loop)  # refused sockets: FIN, then the peer's last bytes, then close
        self.poll = PollSet(self.loop)  # the L4 path's sockets: backend connects and splice pipes
        self.l7 = WorkerL7Context(
            self.cfg, self.loop, self.counters, self.backends, self.policy, self.policy_values, self.index
        )
        self.entry = TLSEntry(
            self.loop, self.counters, self.l7, self.sni.front, self.cfg.limits.handshake_timeout_s, self.bridges
        )
        self.door = Door(
            self.loop,
            self.cfg,
            self.counters,
            self.backends,
            self.conncap,
            self.poll,
            self.pipes,
            self.lingering,
            self.entry.serve,
            self.index,
            self.classifier,
        )
        self.acceptor = Acceptor(self.loop, self.counters, self.open, self.door.enter, self._serve_http, self.index)
        self.stopped = self.loop.create_future()
        self.certs.bootstrap()  # first boot generates it (once, under a file lock), not the first handshake
        self.policy.waf_engine()  # the rule set loads now (~0.1 s), not on the first request
        https = bind_reuseport(
            self.cfg.listen.https, "listen.https", defer_accept_s=max(1, int(self.cfg.limits.peek_timeout_s))
        )
        self.listeners.append(https)
        self.acceptor.watch(https, HTTPS)
        if self.cfg.listen.http:
            self.http_listener = bind_reuseport(self.cfg.listen.http, "listen.http")
            self.listeners.append(self.http_listener)
            self.acceptor.watch(self.http_listener, HTTP)
        if self.cfg.listen.internal_l4:
            self.internal_l4_listener = bind_reuseport(
                self.cfg.listen.internal_l4,
                "listen.internal_l4",
                defer_accept_s=max(1, int(self.cfg.limits.peek_timeout_s)),
            )
            self.listeners.append(self.internal_l4_listener)
            self.acceptor.watch(self.internal_l4_listener, INTERNAL_L4)
        self.loop.add_signal_handler(signal.SIGTERM, self.begin_drain)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the supervisor decides
        self.loop.add_signal_handler(signal.SIGQUIT, self._stop_now)
        self.loop.add_signal_handler(signal.SIGHUP, lambda: None)  # the supervisor replaces us instead
        # Everything alive now (modules, config, the first routing table) lives as long as the worker: out of the
        # collector's sight, so a full collection walks only what traffic allocated (and forked pages stay shared)
        gc.collect()
        gc.freeze()
        lifecycle.send(self.status_fd, lifecycle.WORKER_LISTENING)
        event("worker_listening", worker=self.index, listeners=len(self.listeners))  # a respawn shows as this too
        code = await self.stopped
        self.pipes.close()
        self.poll.close()
        self.entry.close()
        self.lingering.close_all()
        self.l7.pool.close()
        self.l7.gate.close()
        return code

    def _close_listeners(self) -> None:
        for sock in self.listeners:
            self.loop.remove_reader(sock.fileno())
            sock.close()
        self.listeners.clear()

    def begin_drain(self) -> None:
        """Stop accepting; let every held connection finish; exit at zero or at drain_timeout_s."""
        if self.draining:
            return
        self.draining = True
        setproctitle.setproctitle(f"sentin8-proxy: worker {self.index} [draining]")
        self._close_listeners()
        self.l7.pool.close_idle()
        self.bridges.begin_drain()
        self.loop.call_later(self.cfg.fleet.drain_timeout_s, self._finish, 0)
        self.open.notify_releases(self._maybe_finished)
        self._maybe_finished()

    def _stop_now(self) -> None:
        self._close_listeners()
        self._finish(0)

    def _finish(self, code: int) -> None:
        if not self.stopped.done():
            self.stopped.set_result(code)

    def _maybe_finished(self) -> None:
        if self.draining and self.open.count == 0:
            self._finish(0)

    # ---- one connection (accepted by workers.listener.Acceptor) --------------------------------------------

    def _serve_http(self, conn: socket.socket, addr: tuple, hold: Hold) -> None:
        """:80 — ACME HTTP-01 only, for every source; everything else is 404. Called by the accept loop: a
        failure costs this connection (closed, its hold released), never the rest of the accept batch."""
        try:
            self.counters.inc("connections_http")
            self.counters.traffic(not self.classifier.is_internal(addr[0]))
            adopt(self.loop, lambda: self._new_http_bridge(addr, hold), conn, lambda _exc: hold.release())
        except Exception:
            conn.close()
            hold.release()

    def _new_http_bridge(self, addr: tuple, hold: Hold) -> _TrackedHTTP:
        bridge = self.bridges.add(_TrackedHTTP(self.l7, self.loop, addr, "http"))
        bridge.track(self.bridges, hold)
        bridge.external = not self.classifier.is_internal(addr[0])
        return bridge

    # ---- certificates and tickets ------------------------------------------------------------------

    def _cert_rejected(self, dirname: str, reason: str) -> None:
        self.counters.inc("cert_rejected")
        self.cert_report.rejected(dirname, reason)

    def _cert_loaded(self, cert: ServerCert) -> None:
        self.cert_report.usable(store_dirname(cert.name))

    def _ticket_sealer(self, shared: SharedState) -> session_tickets.TicketSealer | None:
        """Fleet-wide ticket keys, or (if this cryptography build hides the hook) OpenSSL's own per-process
        keys: resumption then works only on the issuing worker, which is said once, loudly."""
        if session_tickets.available():
            return session_tickets.TicketSealer(shared.ticket_keys())
        event("ticket_keys_per_worker", "warning", reason="the bundled OpenSSL's ticket-key hook is unreachable")
        return None


class _TrackedHTTP(PlainHTTPListener):
    """The :80 bridge, releasing its hold when the connection ends."""

    _bridges: Bridges
    _hold: Hold | None = None

    def track(self, bridges: Bridges, hold: Hold) -> None:
        self._bridges = bridges
        self._hold = hold

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            super().connection_lost(exc)
        finally:
            self._bridges.discard(self)
            if self._hold is not None:
                self._hold.release()
