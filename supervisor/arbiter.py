"""The supervisor: creates shared memory, forks the resolver and the workers, keeps them alive, never
handles traffic.

One single-threaded loop waits on two pipes: the signal wakeup pipe (signal numbers) and the children's
status pipe (``sentin8.lifecycle`` messages). Everything else is a scheduled deadline (respawn backoff,
RSS check, kill-after-drain), so the loop sleeps exactly until the next thing to do.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import select
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil
import setproctitle

from sentin8 import lifecycle, runtime_policy
from sentin8.config import Config, ConfigError, load_file, parse_hostport
from sentin8.eventlog import event, install, set_role
from sentin8.shm import fleet as fleet_state
from sentin8.shm.state import SharedState
from sentin8.startup_checks import check_paths

from . import sdnotify
from .reload_status import ReloadStatus

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1)
RSS_CHECK_S = 10.0
STABLE_AFTER_S = 5.0  # a child that lived this long resets its crash backoff
QUIT_GRACE_S = 5.0
PR_SET_PDEATHSIG = 1
REPLACEMENT_LISTEN_TIMEOUT_S = 60.0  # a replacement worker not listening by then fails its reload
START_FAILURES_FATAL = 5  # a child dying this many times in a row before it ever served: exit 2, not a loop
SLOTS_PER_WORKER = 4  # counter slots: the live worker, its replacement, and retirees of two overlapping reloads



@dataclass
class Child:
    role: str  # "resolver" | "worker" | "mgmt"
    index: int
    pid: int
    slot: int = -1
    started: float = field(default_factory=time.monotonic)
    listening: bool = False
    retiring: bool = False  # told to drain because a replacement took over
    kill_at: float | None = None  # a retiree still alive then is SIGKILLed: its slot must come back
    rss: int = 0


def probe_exclusive(address: str, key: str) -> None:
    """Bind ``address`` without SO_REUSEPORT (then let go): fails with EADDRINUSE while anyone listens there,
    a fleet with SO_REUSEPORT included."""
    host, port = parse_hostport(address, key)
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # our own TIME_WAIT leftovers are fine
        sock.bind((host, port))


def port_holder(address: str, key: str) -> str:
    """`` by pid N (title), child of pid M (title)`` for the process listening on the port, or ``""``."""
    _host, port = parse_hostport(address, key)
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return ""
    pids = sorted({c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                   and c.pid})
    if not pids:
        return ""

    def title(pid: int) -> str:
        try:
            return " ".join(psutil.Process(pid).cmdline()) or psutil.Process(pid).name()
        except psutil.Error:
            return "?"

    pid = pids[0]
    text = f" by pid {pid} ({title(pid)})"
    try:
        parent = psutil.Process(pid).ppid()
    except psutil.Error:
        parent = 0
    if parent > 1 and "sentin8-proxy" in title(parent):
        text += f", child of pid {parent} ({title(parent)})"
    return text


def enable_migrate_req() -> bool:
    """Ask the kernel to hand a closing SO_REUSEPORT listener's queued connections to its siblings."""
    try:
        with open("/proc/sys/net/ipv4/tcp_migrate_req", "w") as fh:
            fh.write("1")
        return True
    except OSError:
        return False


class Arbiter:
    def __init__(self, cfg: Config, config_path: str | None, beside: bool = False) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.beside = beside
        self.workers_wanted = cfg.worker_count()
        # Retiring workers keep their slot until they exit (at most drain_timeout_s): room for a replacement
        # beside every worker and for the retirees of overlapping reloads; beyond that a reload waits for a
        # slot instead of failing (``_continue_reload``).
        self.slots = SLOTS_PER_WORKER * self.workers_wanted + 2
        self.children: dict[int, Child] = {}
        self.free_slots = list(range(self.slots))
        self.failures: dict[tuple[str, int], int] = {}
        self.start_failures: dict[tuple[str, int], int] = {}  # consecutive deaths before listening/publishing
        self.exit_code = 0
        self.respawn_at: dict[tuple[str, int], float] = {}
        self.snapshot_ready = False
        self.ready_sent = False
        self.state = "running"  # running | draining | quitting
        self.kill_at: float | None = None
        self.reload_queue: list[int] = []
        self.reload_pending = False  # a SIGHUP arrived during a rolling reload: run another after it
        self.replacing: dict[int, int] = {}  # new worker pid -> old worker pid
        self.reload_status = ReloadStatus(cfg.tls.state_dir)
        self.reload_seq = 0  # SIGHUPs received (coalesced ones count once: the kernel merges them)
        self.reload_running: int | None = None  # the seq the running rolling reload covers
        self.reload_started = 0.0
        self.reload_waiting_slot = False
        self.next_rss_check = time.monotonic() + RSS_CHECK_S
        self._status_buf = b""
        self.mgmt_sock: socket.socket | None = None  # bound once here, inherited by every mgmt process
        self.mgmt_secret = b""
        self.cluster_secret = b""  # cluster.secret_env, checked in _preflight (cluster mode only)

    # ---- setup ---------------------------------------------------------------------------------------

    def _preflight(self) -> str | None:
        """Bind every listener once before forking: a port another program holds is one clear line and
        exit 2, not a worker crash loop that never gets READY. The probe binds without SO_REUSEPORT, so a
        second fleet on the same port is refused too (it would silently split the traffic), unless this
        start is the deliberate second fleet of an upgrade (``beside``). The management
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
        listen = self.cfg.listen
        for key, address in (
            ("listen.https", listen.https),
            ("listen.http", listen.http),
            ("listen.internal_l4", listen.internal_l4),
        ):
            if not address:
                continue
            try:
                probe_exclusive(address, key)
                continue
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    return f"{key}: cannot listen on {address}: {exc.strerror}"
            holder = port_holder(address, key)
            if not self.beside:
                return f"{key}: cannot listen on {address}: already in use{holder}" + (
                    " (to upgrade, start beside it with --beside-running-fleet)" if "sentin8-proxy" in holder else ""
                )
            try:
                bind_reuseport(address, key).close()
            except OSError as exc:
                return f"{key}: cannot listen beside the running fleet on {address}: {exc.strerror}{holder}"
            event("beside_running_fleet", key=key, listen=address, holder=holder.strip(" ()by"))
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
        self.reload_status.start()
        self.shared = SharedState(self.cfg, self.slots)
        self.fleet_state = self.shared.fleet()
        self._publish_runtime_policy()
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
        )
        self._spawn_resolver()
        if self.mgmt_sock is not None:
            event("mgmt_listening", listen=self._mgmt_address())
        if self.cfg.listen.mgmt:
            self._spawn_mgmt()
        return self._loop()

    def _mgmt_address(self) -> str:
        """The bound management address (the real port when listen.mgmt asked for port 0)."""
        assert self.mgmt_sock is not None
        host, port = self.mgmt_sock.getsockname()[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def _publish_runtime_policy(self) -> None:
        """The policy overlay the management API persisted, back in shared memory before any worker starts:
        a fleet restart keeps the operator's runtime changes."""
        try:
            overlay = runtime_policy.load(self.cfg.tls.state_dir)
        except runtime_policy.OverlayError as exc:
            event("runtime_policy_unreadable", "error", reason=str(exc), using="config file [policy]")
            return
        self.shared.policy_writer().publish(overlay)
        if overlay != runtime_policy.Overlay():
            event("runtime_policy_loaded", overlay=runtime_policy.encode(overlay).decode())

    # ---- forking -------------------------------------------------------------------------------------

    def _fork(self, role: str, index: int, title: str, target: Callable[[], int], cpu: int | None = None) -> int:
        pid = os.fork()
        if pid:
            return pid
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            self.cluster_secret = b""  # no child uses it yet (the limiter needs none): keep it out of their memory
            if role != "mgmt":
                self.mgmt_secret = b""  # only the management process needs it
                if self.mgmt_sock is not None:
                    self.mgmt_sock.close()
            for sig in HANDLED_SIGNALS:
                signal.signal(sig, signal.SIG_IGN if sig == signal.SIGUSR1 else signal.SIG_DFL)
            os.close(self.sig_r)
            os.close(self.sig_w)
            os.close(self.status_r)
            try:  # die with the supervisor even if it is SIGKILLed
                ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            except (OSError, AttributeError):
                pass
            if cpu is not None:
                os.sched_setaffinity(0, {cpu})
            setproctitle.setproctitle(title)
            set_role(role)
            code = target()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        raise AssertionError("unreachable")

    def _spawn_resolver(self) -> None:
        from .resolver import Resolver

        cfg = self.cfg

        def target() -> int:
            return Resolver(cfg, self.shared, self.status_w, self.config_path).run()

        pid = self._fork("resolver", 0, "sentin8-proxy: resolver", target)
        self.children[pid] = Child("resolver", 0, pid)

    def _spawn_mgmt(self) -> None:
        from workers.listener import bind_reuseport

        from .mgmt import MgmtProcess  # the web stack once, here: a respawn only forks (no PyJWT: see its run)

        if self.mgmt_sock is None:  # deferred beside a running fleet: retried each second until it lets go
            try:
                self.mgmt_sock = bind_reuseport(self.cfg.listen.mgmt, "listen.mgmt", backlog=1024, reuseport=False)
            except OSError:
                self.respawn_at[("mgmt", 0)] = time.monotonic() + 1.0
                return
            event("mgmt_listening", listen=self._mgmt_address())
        cfg, sock = self.cfg, self.mgmt_sock

        def target() -> int:
            return MgmtProcess(cfg, self.shared, sock, self.mgmt_secret).run()

        pid = self._fork("mgmt", 0, "sentin8-proxy: mgmt", target)
        # listening already (the socket is ours): a failing mgmt process gets backoff, never stops the fleet
        self.children[pid] = Child("mgmt", 0, pid, listening=True)

    def _spawn_worker(self, index: int) -> int | None:
        """Fork worker ``index``; None when every counter slot is taken (workers still draining): retried later."""
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

        pid = self._fork("worker", index, f"sentin8-proxy: worker {index} [cpu {cpu}]", target, cpu)
        self.children[pid] = Child("worker", index, pid, slot)
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
            if self.state != "running" and not self.children:
                event("stopped", exit_code=self.exit_code)
                self.reload_status.stop()
                return self.exit_code

    def _publish_fleet_state(self) -> None:
        """For /health: starting until READY, draining from the first SIGTERM, and the listening workers."""
        if self.state != "running":
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
            self.start_failures.pop((child.role, child.index), None)
        if code == lifecycle.SNAPSHOT_PUBLISHED and not self.snapshot_ready:
            self.snapshot_ready = True
            if self.state == "running":
                for index in range(self.workers_wanted):
                    self._spawn_worker(index)
        elif code == lifecycle.WORKER_LISTENING:
            child.listening = True
            child.kill_at = None
            self.start_failures.pop((child.role, child.index), None)
            old = self.replacing.pop(pid, None)
            if old is not None:
                self._retire(old)
                self._continue_reload()
        self._maybe_ready()

    def _maybe_ready(self) -> None:
        if self.ready_sent or not self.snapshot_ready or self.state != "running":
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
                if self.state == "running":
                    role, index = key
                    if role == "resolver":
                        self._spawn_resolver()
                    elif role == "mgmt":
                        self._spawn_mgmt()
                    elif index < self.workers_wanted and not self._has_worker(index):
                        self._spawn_worker(index)
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

    def _has_worker(self, index: int) -> bool:
        return any(c.index == index and not c.retiring for c in self._workers())

    # ---- signals -------------------------------------------------------------------------------------

    def _on_signal(self, signum: int) -> None:
        if signum == signal.SIGCHLD:
            self._reap()
        elif signum in (signal.SIGTERM, signal.SIGINT):
            if self.state == "draining":
                self._quit()  # asked twice: stop now
            elif self.state == "running":
                self._drain()
        elif signum == signal.SIGQUIT:
            self._quit()
        elif signum == signal.SIGHUP:
            if self.state == "running":
                self._on_sighup()
            else:
                self.reload_seq += 1
                self.reload_status.requested(self.reload_seq)
                self.reload_status.finished(self.reload_seq, "refused", "the fleet is stopping")
                event("reload_refused", "error", seq=self.reload_seq, reason="the fleet is stopping")
        elif signum == signal.SIGUSR1:
            self._dump_stats()

    def _dump_stats(self) -> None:
        """One JSON line of fleet totals (counts and gauges only) and each child's RSS: ``kill -USR1``."""
        totals = {k: v for k, v in self.shared.counter_reader().total().items() if v}
        for child in self.children.values():
            try:
                child.rss = psutil.Process(child.pid).memory_info().rss
            except psutil.Error:
                pass
        rss = {f"{c.role}-{c.index}-{c.pid}": c.rss >> 10 for c in self.children.values()}
        print("stats " + json.dumps({"counters": totals, "rss_kib": rss}, sort_keys=True), flush=True)

    def _kill(self, pid: int, sig: int) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def _drain(self) -> None:
        if self.reload_running is not None:  # a waiting ``reload --wait`` learns why it will never complete
            self.reload_status.finished(self.reload_running, "failed", "the fleet is stopping")
            self.reload_running = None
        self.state = "draining"
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
        self.state = "quitting"
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
                self.free_slots.append(child.slot)
                if self.reload_waiting_slot and self.state == "running":
                    self._continue_reload()
            if self.state != "running":
                if not self._workers():
                    self._stop_support()
                continue
            if child.retiring:
                if child.role == "mgmt":
                    self._spawn_mgmt()  # reloaded: requests waited in the kept socket's accept queue
                continue
            if pid in self.replacing:  # a replacement died before it listened: the reload failed
                self.replacing.pop(pid)
                self.reload_queue.clear()
                self._reload_finished("failed", f"worker {child.index}: replacement exited {code} before listening")
                continue
            self._schedule_respawn(child, code)

    def _schedule_respawn(self, child: Child, code: int) -> None:
        key = (child.role, child.index)
        if not child.listening and not self.ready_sent:
            # Before READY nothing serves yet: a start that cannot succeed is an operator error to report
            # (exit 2, which systemd's RestartPreventExitStatus keeps down), not a loop. After READY the
            # others serve, so a failing child keeps its capped backoff instead of taking the fleet down.
            fails = self.start_failures[key] = self.start_failures.get(key, 0) + 1
            if fails >= START_FAILURES_FATAL:
                what = "publishing a routing table" if child.role == "resolver" else "listening"
                reason = f"{child.role} {child.index} exited {fails} times in a row before {what} (exit code {code})"
                print(f"sentin8-proxy: {reason}: stopping, see the lines above", file=sys.stderr, flush=True)
                event("start_failures", "error", child=child.role, index=child.index, exit_code=code, reason=reason)
                self.exit_code = 2
                self._quit()
                return
        lived = time.monotonic() - child.started
        failures = 0 if lived >= STABLE_AFTER_S else self.failures.get(key, 0) + 1
        self.failures[key] = failures
        delay = min(0.1 * (2**failures) if failures else 0.0, self.cfg.fleet.restart_backoff_max_s)
        event("child_died", "warning", child=child.role, index=child.index, child_pid=child.pid, exit_code=code,
              respawn_in_s=round(delay, 3))
        self.respawn_at[key] = time.monotonic() + delay

    # ---- reload ----------------------------------------------------------------------------------------
    #
    # One rolling reload at a time; SIGHUPs during one coalesce into one more after it (the newest config
    # wins). Each ends observably: a ``reload_done`` / ``reload_refused`` / ``reload_failed`` event, READY=1
    # to systemd (after RELOADING=1 at the start), and the status file ``sentin8-proxy reload --wait`` reads.

    def _on_sighup(self) -> None:
        self.reload_seq += 1
        self.reload_status.requested(self.reload_seq)
        if self.reload_running is not None:
            event("reload_queued", seq=self.reload_seq, running=self.reload_running)
            self.reload_pending = True
            return
        self._reload()

    def _reload(self) -> None:
        seq = self.reload_seq
        self.reload_running = seq
        self.reload_started = time.monotonic()
        if self.ready_sent:  # before the first READY=1 systemd is still waiting for the start, not a reload
            usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
            sdnotify.notify(f"RELOADING=1\nMONOTONIC_USEC={usec}\nSTATUS=reloading (SIGHUP {seq})")
        problem = None
        new_cfg = self.cfg
        if self.config_path is not None:
            try:
                new_cfg = load_file(self.config_path)
                check_paths(new_cfg)
            except ConfigError as exc:
                problem = str(exc)
        if problem is None:
            from sentin8.waf import check_policy  # the rule set loads here: a broken one refuses the reload

            problem = check_policy(new_cfg.policy)
        wanted = new_cfg.worker_count()
        if problem is None and SLOTS_PER_WORKER * wanted + 2 > self.slots:
            problem = f"fleet.workers: {wanted} needs a restart (shared memory sized for fewer)"
        if problem is not None:
            self._reload_finished("refused", problem)
            return
        if new_cfg.shm != self.cfg.shm:
            event("reload_note", "warning", reason="[shm] sizes apply at the next restart")
        if new_cfg.listen.mgmt != self.cfg.listen.mgmt:
            event("reload_note", "warning", reason="listen.mgmt applies at the next restart")
        sources_changed = new_cfg.sources != self.cfg.sources
        self.cfg = new_cfg
        self.workers_wanted = wanted
        for child in list(self.children.values()):
            if child.role == "resolver":
                self._kill(child.pid, signal.SIGTERM if sources_changed else signal.SIGHUP)
            elif child.role == "mgmt":
                self._retire(child.pid)  # its successor starts when it exits (one jti writer at a time)
            elif child.role == "worker" and child.index >= wanted and not child.retiring:
                self._retire(child.pid)
        event("reload_start", seq=seq, workers=wanted)
        self.reload_queue = list(range(wanted))
        self._continue_reload()

    def _continue_reload(self) -> None:
        self.reload_waiting_slot = False
        if self.replacing or self.state != "running":
            return
        while self.reload_queue:
            if not self.free_slots:  # every slot held by a retiree: the next exit frees one (_reap)
                self.reload_waiting_slot = True
                event("reload_waiting_slot", "warning", seq=self.reload_running, retiring=self._retiring_count())
                return
            index = self.reload_queue.pop(0)
            old = [c for c in self._workers() if c.index == index and not c.retiring]
            new_pid = self._spawn_worker(index)
            if new_pid is None:
                continue
            # the next one starts when this one listens (a new index has no old worker to retire: -1)
            self.replacing[new_pid] = old[0].pid if old else -1
            self.children[new_pid].kill_at = time.monotonic() + REPLACEMENT_LISTEN_TIMEOUT_S
            return
        if self.reload_running is not None:
            self._reload_finished("done")
        elif self.reload_pending:
            self._start_pending()

    def _reload_finished(self, result: str, reason: str = "") -> None:
        seq = self.reload_running if self.reload_running is not None else self.reload_seq
        took = round(time.monotonic() - self.reload_started, 3)
        if result == "done":
            event("reload_done", seq=seq, took_s=took, workers=self.workers_wanted, retiring=self._retiring_count())
            status = f"serving with {self.workers_wanted} workers (reload {seq} done)"
        else:
            event(f"reload_{result}", "error", seq=seq, took_s=took, reason=reason)
            status = f"reload {seq} {result}: {reason}"
        self.reload_status.finished(seq, result, reason)
        if self.ready_sent:
            sdnotify.notify(f"READY=1\nSTATUS={status}")
        self.reload_running = None
        if self.reload_pending:
            self._start_pending()

    def _start_pending(self) -> None:
        self.reload_pending = False
        if self.state == "running":
            self._reload()

    def _retiring_count(self) -> int:
        return sum(1 for c in self._workers() if c.retiring)

    def _retire(self, pid: int) -> None:
        child = self.children.get(pid)
        if child is not None:
            child.retiring = True
            # the worker leaves by itself at drain_timeout_s; this is the backstop that frees its slot
            child.kill_at = time.monotonic() + self.cfg.fleet.drain_timeout_s + QUIT_GRACE_S
            self._kill(pid, signal.SIGTERM)

    # ---- memory --------------------------------------------------------------------------------------

    def _check_rss(self) -> None:
        limit = self.cfg.fleet.rss_limit_mb * 1024 * 1024
        for child in list(self.children.values()):
            try:
                child.rss = psutil.Process(child.pid).memory_info().rss
            except psutil.Error:
                continue
            if limit and child.role == "worker" and child.rss > limit and not child.retiring and not self.replacing:
                event("worker_rss_recycle", "warning", worker=child.index, rss_mib=child.rss >> 20,
                      limit_mib=limit >> 20)
                self.reload_queue.append(child.index)
                self._continue_reload()


def run(config_path: str | None, cfg: Config, beside: bool = False) -> int:
    return Arbiter(cfg, config_path, beside).run()
