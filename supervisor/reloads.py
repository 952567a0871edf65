"""The supervisor's side of rolling reloads: drives ``sentin8.reload.RollingReload`` with real processes.

One reload at a time (``current``); SIGHUPs during one coalesce into one more after it (``queued``: the
newest config wins). Each ends observably: a ``reload_done`` / ``reload_refused`` / ``reload_failed`` event,
READY=1 to systemd (after RELOADING=1 at the start), and the status record ``sentin8-proxy reload --wait``
reads (``reload_status``: a memfd, so a full disk cannot hide it). The fleet (``Arbiter``) is asked for
processes through its public methods; this module never touches its children itself.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from sentin8.config import Config, ConfigError, load_file
from sentin8.eventlog import event
from sentin8.reload import DONE, FAILED, REFUSED, WAITING_SLOT, RollingReload
from sentin8.startup_checks import check_paths

from . import sdnotify
from .listeners import check_at_reload
from .reload_status import ReloadStatus

if TYPE_CHECKING:
    from .arbiter import Arbiter

REPLACEMENT_LISTEN_TIMEOUT_S = 60.0  # a replacement worker not listening by then fails its reload
RESULTS = {DONE: "done", REFUSED: "refused", FAILED: "failed"}


class Reloads:
    def __init__(self, fleet: Arbiter, config_path: str | None) -> None:
        self.fleet = fleet
        self.config_path = config_path
        self.status = ReloadStatus(config_path)
        self.seq = 0  # SIGHUPs received (coalesced ones count once: the kernel merges them)
        self.current: RollingReload | None = None
        self.queued: RollingReload | None = None

    # ---- what the fleet tells us -----------------------------------------------------------------------

    def on_sighup(self) -> None:
        self.seq += 1
        self.status.requested(self.seq)
        now = time.monotonic()
        if not self.fleet.running:
            refused = RollingReload(self.seq, now)
            refused.refuse("the fleet is stopping")
            self._report(refused)
        elif self.current is not None:
            if self.queued is None:
                self.queued = RollingReload(self.seq, now, queued=True)
            else:
                self.queued.coalesce(self.seq)
            event("reload_queued", seq=self.seq, running=self.current.seq)
        else:
            self._begin(RollingReload(self.seq, now))

    def recycle(self, index: int) -> None:
        """Replace worker ``index`` with the same config (its memory is over the limit): a reload nobody
        waits for, or one more index in the reload that is rolling anyway."""
        if self.current is None:
            self.current = RollingReload(0, time.monotonic())
            self.current.plan([index])
        else:
            self.current.add(index)
        self.advance()

    def on_listening(self, pid: int) -> None:
        """A worker listens: if it is the starting replacement, the one it replaces drains and the roll
        goes on."""
        reload = self.current
        if reload is None or not reload.is_replacement(pid):
            return
        old = reload.replacement_listening(pid)
        if old >= 0:
            self.fleet.retire(old)
        self.advance()

    def on_exit(self, pid: int, index: int, code: int) -> bool:
        """A worker exited; True when it was the starting replacement (its reload failed)."""
        reload = self.current
        if reload is None or not reload.is_replacement(pid):
            return False
        reload.replacement_died(pid, f"worker {index}: replacement exited {code} before listening")
        self._end()
        return True

    def on_slot_freed(self) -> None:
        if self.current is not None and self.current.state is WAITING_SLOT and self.fleet.running:
            self.advance()

    def on_stopping(self) -> None:
        """The fleet drains or quits: a waiting ``reload --wait`` learns why its reload will never complete."""
        for reload in (self.current, self.queued):
            if reload is not None and not reload.ended:
                reload.fail("the fleet is stopping")
                self._report(reload)
        self.current = self.queued = None

    @property
    def rolling(self) -> bool:
        return self.current is not None

    # ---- the roll ------------------------------------------------------------------------------------

    def _begin(self, reload: RollingReload) -> None:
        self.current = reload
        if self.fleet.ready_sent:  # before the first READY=1 systemd is still waiting for the start
            usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
            sdnotify.notify(f"RELOADING=1\nMONOTONIC_USEC={usec}\nSTATUS=reloading (SIGHUP {reload.seq})")
        new_cfg, problem = self._check()
        if problem is not None or new_cfg is None:
            reload.refuse(problem or "")
            self._end()
            return
        self.fleet.apply(new_cfg)
        event("reload_start", seq=reload.seq, workers=new_cfg.worker_count())
        reload.plan(list(range(new_cfg.worker_count())))
        self.advance()

    def _check(self) -> tuple[Config | None, str | None]:
        """The new config as the fleet would start with it: the file, what it names, the rule set, its
        listeners against the system, and room in the shared memory sized at start."""
        running = self.fleet.cfg
        if self.config_path is None:
            return running, None
        try:
            new_cfg = load_file(self.config_path)
            check_paths(new_cfg)
        except ConfigError as exc:
            return None, str(exc)
        from sentin8.waf import check_policy  # the rule set loads here: a broken one refuses the reload

        problem = check_policy(new_cfg.policy) or check_at_reload(new_cfg, running)
        wanted = new_cfg.worker_count()
        if problem is None and not self.fleet.fits(wanted):
            problem = f"fleet.workers: {wanted} needs a restart (shared memory sized for fewer)"
        if problem is not None:
            return None, problem
        if new_cfg.shm != running.shm:
            event("reload_note", "warning", reason="[shm] sizes apply at the next restart")
        if new_cfg.listen.mgmt != running.listen.mgmt:
            event("reload_note", "warning", reason="listen.mgmt applies at the next restart")
        return new_cfg, None

    def advance(self) -> None:
        """Start the next replacement if the reload can; end it when nothing is left to replace."""
        reload = self.current
        if reload is None or not self.fleet.running:
            return
        step = reload.advance(self.fleet.slot_free())
        if step is not None:
            old = self.fleet.live_worker(step.index)
            new_pid = self.fleet.spawn_worker(step.index, listen_by=time.monotonic() + REPLACEMENT_LISTEN_TIMEOUT_S)
            assert new_pid is not None  # a slot was free
            reload.replacement_started(new_pid, old if old is not None else -1)
        elif reload.state is WAITING_SLOT:  # every slot held by a retiree: the next exit frees one
            event("reload_waiting_slot", "warning", seq=reload.seq, retiring=self.fleet.retiring_count())
        elif reload.ended:
            self._end()

    def _end(self) -> None:
        assert self.current is not None and self.current.ended
        self._report(self.current)
        self.current, queued = None, self.queued
        if queued is not None and self.fleet.running:
            self.queued = None
            queued.begin(time.monotonic())
            self._begin(queued)

    def _report(self, reload: RollingReload) -> None:
        result = RESULTS[reload.state]
        took = round(time.monotonic() - reload.started, 3)
        if reload.recycle:
            if reload.state is FAILED:
                event("worker_recycle_failed", "error", took_s=took, reason=reload.reason)
            return
        if reload.state is DONE:
            workers = self.fleet.cfg.worker_count()
            event("reload_done", seq=reload.seq, took_s=took, workers=workers, retiring=self.fleet.retiring_count())
            status = f"serving with {workers} workers (reload {reload.seq} done)"
        else:
            event(f"reload_{result}", "error", seq=reload.seq, took_s=took, reason=reload.reason)
            status = f"reload {reload.seq} {result}: {reload.reason}"
        self.status.finished(reload.seq, result, reload.reason)
        if self.fleet.ready_sent and self.fleet.running:
            sdnotify.notify(f"READY=1\nSTATUS={status}")
