"""The supervisor: creates shared memory, forks the resolver and the workers, keeps them alive, never
handles traffic.

The arbiter is the loop that converges the fleet on what the config wants: one resolver, one management
process, ``workers_wanted`` listening workers. One single-threaded loop waits on two pipes: the signal
wakeup pipe (signal numbers, dispatched through ``SIGNALS``) and the children's status pipe
(``sentin8.lifecycle`` messages). Everything else is a scheduled deadline (respawn backoff, RSS check,
kill-after-drain), so the loop sleeps exactly until the next thing to do. Rolling reloads are their own
concept (``reloads.Reloads`` driving ``sentin8.reload.RollingReload``); the arbiter gives them processes.

The fleet's own state: RUNNING (converging), DRAINING (SIGTERM: workers finish, nothing respawns),
QUITTING (SIGQUIT, or SIGTERM twice: everything is told to stop now).
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable
from enum import Enum

import setproctitle

import sentin8
from sentin8 import lifecycle
from sentin8.config import Config, ConfigError
from sentin8.eventlog import event, install
from sentin8.shm import fleet as fleet_state
from sentin8.shm.state import SharedState

from . import sdnotify
from .children import Child, Respawns, counter_slots, fork, refresh_rss
from .listeners import bound_address, check_at_start, enable_migrate_req
from .reloads import Reloads
from .runtime_policy_boot import republish_runtime_policy

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1)
RSS_CHECK_S = 10.0
QUIT_GRACE_S = 5.0


class FleetState(Enum):
    RUNNING = "running"
    DRAINING = "draining"
    QUITTING = "quitting"


class Arbiter:
    def __init__(self, cfg: Config, config_path: str | None, beside: bool = False) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.beside = beside
        self.workers_wanted = cfg.worker_count()
        # Retiring workers keep their slot until they exit (at most drain_timeout_s): room for a replacement
        # beside every worker and for the retirees of overlapping reloads; beyond that a reload waits for a
        # slot instead of failing (WAITING_SLOT).
        self.slots = counter_slots(self.workers_wanted)
        self.resolver_slot = self.slots - 1  # never a worker's: its counts fold into the totals at each exit
        self.children: dict[int, Child] = {}
        self.free_slots = list(range(self.resolver_slot))
        self.respawns = Respawns()
        self.exit_code = 0
        self.respawn_at: dict[tuple[str, int], float] = {}
        self.snapshot_ready = False
        self.ready_sent = False
        self.state = FleetState.RUNNING
        self.kill_at: float | None = None
        self.reloads = Reloads(self, config_path)
        self.next_rss_check = time.monotonic() + RSS_CHECK_S
        self._status_buf = b""
        self.mgmt_sock: socket.socket | None = None  # bound once here, inherited by every mgmt process
        self.mgmt_secret = b""
        self.cluster_secret = b""  # cluster.secret_credential / secret_env, checked in _preflight (cluster mode)
        self.signals: dict[int, Callable[[], None]] = {  # the signal table: what each one asks of the fleet
            signal.SIGCHLD: self._reap,
            signal.SIGTERM: self._on_sigterm,
            signal.SIGINT: self._on_sigterm,
            signal.SIGQUIT: self._quit,
            signal.SIGHUP: self.reloads.on_sighup,
            signal.SIGUSR1: self._dump_stats,
        }

    # ---- what a reload asks of the fleet (``Reloads``) -------------------------------------------------

    @property
    def running(self) -> bool:
        return self.state is FleetState.RUNNING

    def fits(self, workers: int) -> bool:
        """Whether the shared memory sized at start has the counter slots for ``workers``."""
        return counter_slots(workers) <= self.slots

    def slot_free(self) -> bool:
        return bool(self.free_slots)

    def live_worker(self, index: int) -> int | None:
        """The pid of worker ``index`` that is not draining, if there is one."""
        return next((c.pid for c in self._workers() if c.index == index and not c.retiring), None)

    def retiring_count(self) -> int:
        return sum(1 for c in self._workers() if c.retiring)

    def apply(self, new_cfg: Config) -> None:
        """A checked config becomes the fleet's: the resolver re-reads (restarts if its sources changed), the
        management process is replaced, surplus workers drain. The workers themselves are replaced by the
        reload, one at a time."""
        sources_changed = new_cfg.sources != self.cfg.sources
        self.cfg = new_cfg
        self.workers_wanted = new_cfg.worker_count()
        for child in list(self.children.values()):
            if child.role == "resolver":
                self._kill(child.pid, signal.SIGTERM if sources_changed else signal.SIGHUP)
            elif child.role == "mgmt":
                self.retire(child.pid)  # its successor starts when it exits (one jti writer at a time)
            elif child.role == "worker" and child.index >= self.workers_wanted and not child.retiring:
                self.retire(child.pid)

    def retire(self, pid: int) -> None:
        child = self.children.get(pid)
        if child is not None:
            child.retiring = True
            # the worker leaves by itself at drain_timeout_s; this is the backstop that frees its slot
            child.kill_at = time.monotonic() + self.cfg.fleet.drain_timeout_s + QUIT_GRACE_S
            self._kill(pid, signal.SIGTERM)

    # ---- setup ---------------------------------------------------------------------------------------

    def _preflight(self) -> str | None:
        """Bind every listener once before forking: a port another program holds is one clear line and
        exit 2, not a worker crash loop that never gets READY (``listeners.check_at_start``). The management
        port stays bound (its process inherits it), and its JWT secret is checked here too."""
        from workers.listener import bind_reuseport

        if self.cfg.cluster.enabled:  # read once, before any fork: what hosts share in Valkey is keyed by it
            from sentin8.cluster.secret import load_secret as load_cluster_secret

            try:
                self.cluster_secret = load_cluster_secret(self.cfg.cluster, os.environ)
            except ConfigError as exc:
                return str(exc)
        if self.cfg.listen.mgmt:  # a config error like the others: before anything binds
            from sentin8.mgmt.credentials import load_secret  # no PyJWT: every worker is forked from here

            try:
                self.mgmt_secret = load_secret(self.cfg.mgmt, os.environ)
            except ConfigError as exc:
                return str(exc)
        problem = check_at_start(self.cfg, self.beside)
        if problem is not None:
            return problem
        if self.cfg.listen.mgmt:
            try:
                self.mgmt_sock = bind_reuseport(self.cfg.listen.mgmt, "listen.mgmt", backlog=1024, reuseport=False)
            except OSError as exc:
                if not (self.beside and exc.errno == errno.EADDRINUSE):
                    return f"listen.mgmt: cannot listen on {self.cfg.listen.mgmt}: {exc.strerror}"
                # the fleet this one replaces still serves it: take it over once that one lets go
                event("mgmt_deferred", "warning", listen=self.cfg.listen.mgmt, reason="in use by the running fleet")
        return None

    def run(self) -> int:
        problem = self._preflight()
        if problem is not None:
            print(f"sentin8-proxy: {problem}", file=sys.stderr, flush=True)
            return 2
        setproctitle.setproctitle("sentin8-proxy: supervisor")
        install()
        self.reloads.status.start()
        self.shared = SharedState(self.cfg, self.slots)
        self.fleet_state = self.shared.fleet()
        republish_runtime_policy(self.cfg.tls.state_dir, self.shared.policy_writer())
        migrate = enable_migrate_req()
        self.status_r, self.status_w = os.pipe()
        os.set_blocking(self.status_r, False)
        self.sig_r, self.sig_w = os.pipe()
        os.set_blocking(self.sig_r, False)
        os.set_blocking(self.sig_w, False)
        signal.set_wakeup_fd(self.sig_w, warn_on_full_buffer=False)
        for sig in HANDLED_SIGNALS:
            signal.signal(sig, lambda *_: None)  # the wakeup pipe carries the number; the loop acts on it
        event(
            "start",
            workers=self.workers_wanted,
            listen=self.cfg.listen.https,
            shm_kib=self.shared.region.size // 1024,
            tcp_migrate_req=migrate,
            build=sentin8.BUILD,
        )
        if sentin8.BUILD != "compiled":  # the same code at ~2.3x the instructions per request: an operator must know
            event("pure_python", "warning", hint="install a wheel built with a C compiler (docs/compiled.md)")
        self._spawn_resolver()
        if self.mgmt_sock is not None:
            event("mgmt_listening", listen=bound_address(self.mgmt_sock))
        if self.cfg.listen.mgmt:
            self._spawn_mgmt()
        return self._loop()

    # ---- forking -------------------------------------------------------------------------------------

    def _fork(self, role: str, title: str, target: Callable[[], int], cpu: int | None = None) -> int:
        def before() -> None:
            if role != "resolver":
                self.cluster_secret = b""  # only the resolver (its ticket syncer) needs it: out of other children
            if role != "mgmt":
                self.mgmt_secret = b""  # only the management process needs it
                if self.mgmt_sock is not None:
                    self.mgmt_sock.close()

        close = (self.sig_r, self.sig_w, self.status_r, self.reloads.status.fd)
        return fork(role, title, target, signals=HANDLED_SIGNALS, close_fds=close, cpu=cpu, before=before)

    def _spawn_resolver(self) -> None:
        from .resolver import Resolver

        cfg = self.cfg

        def target() -> int:
            secret = self.cluster_secret
            return Resolver(cfg, self.shared, self.status_w, self.config_path, self.resolver_slot, secret).run()

        pid = self._fork("resolver", "sentin8-proxy: resolver", target)
        self.children[pid] = Child("resolver", 0, pid, self.resolver_slot)

    def _spawn_mgmt(self) -> None:
        from workers.listener import bind_reuseport

        from .mgmt import MgmtProcess  # the web stack once, here: a respawn only forks (no PyJWT: see its run)

        if self.mgmt_sock is None:  # deferred beside a running fleet: retried each second until it lets go
            try:
                self.mgmt_sock = bind_reuseport(self.cfg.listen.mgmt, "listen.mgmt", backlog=1024, reuseport=False)
            except OSError:
                self.respawn_at[("mgmt", 0)] = time.monotonic() + 1.0
                return
            event("mgmt_listening", listen=bound_address(self.mgmt_sock))
        cfg, sock = self.cfg, self.mgmt_sock

        def target() -> int:
            return MgmtProcess(cfg, self.shared, sock, self.mgmt_secret).run()

        pid = self._fork("mgmt", "sentin8-proxy: mgmt", target)
        # listening already (the socket is ours): a failing mgmt process gets backoff, never stops the fleet
        self.children[pid] = Child("mgmt", 0, pid, listening=True)

    def spawn_worker(self, index: int, listen_by: float | None = None) -> int | None:
        """Fork worker ``index``; None when every counter slot is taken (workers still draining): retried
        later. ``listen_by``: a replacement not listening by then is killed (its reload fails)."""
        from workers.worker import Worker

        if not self.free_slots:
            event("worker_slot_wait", "warning", worker=index, retry_s=1.0)
            self.respawn_at[("worker", index)] = time.monotonic() + 1.0
            return None
        cpus = sorted(os.sched_getaffinity(0))
        cpu = cpus[index % len(cpus)]
        slot = self.free_slots.pop(0)
        cfg = self.cfg

        def target() -> int:
            return Worker(cfg, self.shared, index, slot, self.status_w).run()

        pid = self._fork("worker", f"sentin8-proxy: worker {index} [cpu {cpu}]", target, cpu)
        self.children[pid] = Child("worker", index, pid, slot, kill_at=listen_by)
        return pid

    def _workers(self) -> list[Child]:
        return [c for c in self.children.values() if c.role == "worker"]

    # ---- the loop ------------------------------------------------------------------------------------

    def _loop(self) -> int:
        while True:
            timeout = self._next_deadline() - time.monotonic()
            try:
                readable, _, _ = select.select([self.sig_r, self.status_r], [], [], max(0.0, timeout))
            except InterruptedError:
                readable = []
            if self.sig_r in readable:
                for signum in self._read_signals():
                    self._on_signal(signum)
            if self.status_r in readable:
                self._read_status()
            self._run_due()
            self._publish_fleet_state()
            if not self.running and not self.children:
                event("stopped", exit_code=self.exit_code)
                self.reloads.status.close()
                return self.exit_code

    def _publish_fleet_state(self) -> None:
        """For /health: starting until READY, draining from the first SIGTERM, and the listening workers."""
        if not self.running:
            state = fleet_state.DRAINING
        else:
            state = fleet_state.RUNNING if self.ready_sent else fleet_state.STARTING
        listening = sum(1 for c in self._workers() if c.listening)
        self.fleet_state.publish(state, listening, self.workers_wanted)

    def _next_deadline(self) -> float:
        deadlines = [self.next_rss_check, *self.respawn_at.values()]
        if self.kill_at is not None:
            deadlines.append(self.kill_at)
        deadlines += [c.kill_at for c in self.children.values() if c.kill_at is not None]
        return min(deadlines)

    def _read_signals(self) -> list[int]:
        try:
            data = os.read(self.sig_r, 4096)
        except BlockingIOError:
            return []
        return list(data)

    def _read_status(self) -> None:
        try:
            self._status_buf += os.read(self.status_r, 65536)
        except BlockingIOError:
            return
        messages = lifecycle.parse(self._status_buf)
        self._status_buf = self._status_buf[len(messages) * lifecycle.MESSAGE_BYTES :]
        for pid, code in messages:
            self._on_status(pid, code)

    def _on_status(self, pid: int, code: int) -> None:
        child = self.children.get(pid)
        if child is None:
            return
        if code == lifecycle.SNAPSHOT_PUBLISHED:
            child.listening = True  # the resolver's "serving": it published a table
            self.respawns.served(child)
        if code == lifecycle.SNAPSHOT_PUBLISHED and not self.snapshot_ready:
            self.snapshot_ready = True
            if self.running:
                for index in range(self.workers_wanted):
                    self.spawn_worker(index)
        elif code == lifecycle.WORKER_LISTENING:
            child.listening = True
            child.kill_at = None
            self.respawns.served(child)
            self.reloads.on_listening(pid)
        self._maybe_ready()

    def _maybe_ready(self) -> None:
        if self.ready_sent or not self.snapshot_ready or not self.running:
            return
        live = [c for c in self._workers() if not c.retiring]
        if len(live) >= self.workers_wanted and all(c.listening for c in live):
            self.ready_sent = True
            sdnotify.notify(f"READY=1\nMAINPID={os.getpid()}\nSTATUS=serving with {len(live)} workers")
            event("ready", workers=len(live), listen=self.cfg.listen.https)

    def _run_due(self) -> None:
        now = time.monotonic()
        for key, when in list(self.respawn_at.items()):
            if when <= now:
                del self.respawn_at[key]
                if self.running:
                    role, index = key
                    if role == "resolver":
                        self._spawn_resolver()
                    elif role == "mgmt":
                        self._spawn_mgmt()
                    elif index < self.workers_wanted and self.live_worker(index) is None:
                        self.spawn_worker(index)
        if self.kill_at is not None and now >= self.kill_at:
            for child in self.children.values():
                self._kill(child.pid, signal.SIGKILL)
            self.kill_at = None
        for child in list(self.children.values()):
            if child.kill_at is not None and now >= child.kill_at:
                child.kill_at = None
                if child.retiring:
                    event("worker_drain_overrun", "warning", worker=child.index, child_pid=child.pid)
                else:  # a replacement that never listened: its reload fails, the old worker stays
                    event("worker_listen_timeout", "error", worker=child.index, child_pid=child.pid)
                self._kill(child.pid, signal.SIGKILL)
        if now >= self.next_rss_check:
            self.next_rss_check = now + RSS_CHECK_S
            self._check_rss()

    # ---- signals -------------------------------------------------------------------------------------

    def _on_signal(self, signum: int) -> None:
        handler = self.signals.get(signum)
        if handler is not None:
            handler()

    def _on_sigterm(self) -> None:
        if self.state is FleetState.DRAINING:
            self._quit()  # asked twice: stop now
        elif self.running:
            self._drain()

    def _dump_stats(self) -> None:
        """One JSON line of fleet totals (counts and gauges only) and each child's RSS: ``kill -USR1``."""
        totals = {k: v for k, v in self.shared.counter_reader().total().items() if v}
        refresh_rss(self.children.values())
        rss = {f"{c.role}-{c.index}-{c.pid}": c.rss >> 10 for c in self.children.values()}
        print("stats " + json.dumps({"counters": totals, "rss_kib": rss}, sort_keys=True), flush=True)

    def _kill(self, pid: int, sig: int) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def _drain(self) -> None:
        self.state = FleetState.DRAINING
        self.reloads.on_stopping()
        sdnotify.notify("STOPPING=1")
        event("drain", timeout_s=self.cfg.fleet.drain_timeout_s)
        self.respawn_at.clear()
        workers = self._workers()
        for child in workers:
            self._kill(child.pid, signal.SIGTERM)
        if not workers:
            self._stop_support()
        self.kill_at = time.monotonic() + self.cfg.fleet.drain_timeout_s + QUIT_GRACE_S

    def _quit(self) -> None:
        self.state = FleetState.QUITTING
        self.reloads.on_stopping()
        sdnotify.notify("STOPPING=1")
        event("quit")
        self.respawn_at.clear()
        for child in self.children.values():
            self._kill(child.pid, signal.SIGQUIT)
        self.kill_at = time.monotonic() + QUIT_GRACE_S

    def _stop_support(self) -> None:
        """Once no worker is left, the processes that only serve workers go too."""
        for child in self.children.values():
            if child.role != "worker":
                self._kill(child.pid, signal.SIGTERM)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            if child.slot >= 0:
                reader = self.shared.counter_reader()
                reader.zero_gauges(child.slot)
                reader.retire(child.slot)  # its counts join the retired total: no total ever goes down
                self.shared.connection_counts(None).zero_column(child.slot)  # its connections died with it
                if child.role == "worker":
                    self.free_slots.append(child.slot)
                self.reloads.on_slot_freed()
            if not self.running:
                if not self._workers():
                    self._stop_support()
                continue
            if child.retiring:
                if child.role == "mgmt":
                    self._spawn_mgmt()  # reloaded: requests waited in the kept socket's accept queue
                continue
            if self.reloads.on_exit(pid, child.index, code):  # a replacement that never listened: the reload
                if self.live_worker(child.index) is None:  # failed; the old worker serves (a new index: respawn)
                    self._schedule_respawn(child, code)
                continue
            self._schedule_respawn(child, code)

    def _schedule_respawn(self, child: Child, code: int) -> None:
        fails = self.respawns.fatal(child, self.ready_sent)
        if fails:
            what = "publishing a routing table" if child.role == "resolver" else "listening"
            reason = f"{child.role} {child.index} exited {fails} times in a row before {what} (exit code {code})"
            print(f"sentin8-proxy: {reason}: stopping, see the lines above", file=sys.stderr, flush=True)
            event("start_failures", "error", child=child.role, index=child.index, exit_code=code, reason=reason)
            self.exit_code = 2
            self._quit()
            return
        delay = self.respawns.delay(child, time.monotonic(), self.cfg.fleet.restart_backoff_max_s)
        event("child_died", "warning", child=child.role, index=child.index, child_pid=child.pid, exit_code=code,
              respawn_in_s=round(delay, 3))  # fmt: skip
        self.respawn_at[(child.role, child.index)] = time.monotonic() + delay

    # ---- memory --------------------------------------------------------------------------------------

    def _check_rss(self) -> None:
        limit = self.cfg.fleet.rss_limit_mb * 1024 * 1024
        refresh_rss(self.children.values())
        for child in list(self.children.values()):
            if limit and child.role == "worker" and child.rss > limit and not child.retiring:
                if self.reloads.current is not None and self.reloads.current.is_replacement(child.pid):
                    continue  # a replacement starting: judged once it serves
                event(
                    "worker_rss_recycle", "warning", worker=child.index, rss_mib=child.rss >> 20, limit_mib=limit >> 20
                )
                self.reloads.recycle(child.index)


def run(config_path: str | None, cfg: Config, beside: bool = False) -> int:
    return Arbiter(cfg, config_path, beside).run()
