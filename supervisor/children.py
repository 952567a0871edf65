"""The supervisor's children: what it knows of each one, how one is forked, and when a dead one returns.

A child is forked, never exec'd: it starts from the supervisor's memory (the config, the shared memory
mapping, the imported modules) and leaves only by ``os._exit``, so nothing of pytest's or the CLI's
``atexit`` runs in it and an exception is one traceback on stderr, never a second supervisor.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import psutil
import setproctitle

from sentin8.eventlog import set_role

PR_SET_PDEATHSIG = 1
STABLE_AFTER_S = 5.0  # a child that lived this long resets its crash backoff
START_FAILURES_FATAL = 5  # a child dying this many times in a row before it ever served: exit 2, not a loop


SLOTS_PER_WORKER = 4  # counter slots: the live worker, its replacement, and retirees of two overlapping reloads


def counter_slots(workers: int) -> int:
    """Counter blocks for a fleet of ``workers``: theirs, 2 spare, and the resolver's (the last one)."""
    return SLOTS_PER_WORKER * workers + 2 + 1


@dataclass
class Child:
    role: str  # "resolver" | "worker" | "mgmt"
    index: int
    pid: int
    slot: int = -1
    started: float = field(default_factory=time.monotonic)
    listening: bool = False
    retiring: bool = False  # told to drain because a replacement took over
    kill_at: float | None = None  # a retiree (or a replacement) still alive then is SIGKILLed
    rss: int = 0


def fork(
    role: str,
    title: str,
    target: Callable[[], int],
    *,
    signals: Iterable[signal.Signals],
    close_fds: Iterable[int],
    cpu: int | None = None,
    before: Callable[[], None] | None = None,
) -> int:
    """Fork a child that runs ``target`` and exits with its return value; returns the child's pid.

    In the child: the supervisor's ``signals`` go back to their defaults (SIGUSR1 ignored: it asks the
    supervisor for stats), ``close_fds`` are closed (the supervisor's pipes' other ends, its status memfd),
    the child dies with the supervisor even if that one is SIGKILLed, and ``before`` runs first (to drop
    what only some roles may keep)."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in signals:
            signal.signal(sig, signal.SIG_IGN if sig == signal.SIGUSR1 else signal.SIG_DFL)
        for fd in close_fds:
            if fd >= 0:
                os.close(fd)
        if before is not None:
            before()
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


def refresh_rss(children: Iterable[Child]) -> None:
    """Each child's resident memory now (one that just exited keeps its last figure)."""
    for child in children:
        try:
            child.rss = psutil.Process(child.pid).memory_info().rss
        except psutil.Error:
            pass


class Respawns:
    """When a dead child comes back, and when dying again is an operator error instead (no I/O).

    A child that lived ``STABLE_AFTER_S`` comes back at once; one that keeps dying waits 0.2 s, 0.4 s, ...
    up to ``restart_backoff_max_s``. Before READY nothing serves yet: ``START_FAILURES_FATAL`` deaths in a
    row before a child ever served is a start that cannot succeed (exit 2, which systemd's
    RestartPreventExitStatus keeps down), not a loop. After READY the others serve, so a failing child
    keeps its capped backoff instead of taking the fleet down."""

    def __init__(self) -> None:
        self.failures: dict[tuple[str, int], int] = {}
        self.start_failures: dict[tuple[str, int], int] = {}  # consecutive deaths before listening/publishing

    def served(self, child: Child) -> None:
        self.start_failures.pop((child.role, child.index), None)

    def fatal(self, child: Child, ready: bool) -> int:
        """The count of deaths in a row before serving when that stops the fleet, else 0."""
        if child.listening or ready:
            return 0
        key = (child.role, child.index)
        fails = self.start_failures[key] = self.start_failures.get(key, 0) + 1
        return fails if fails >= START_FAILURES_FATAL else 0

    def delay(self, child: Child, now: float, backoff_max_s: float) -> float:
        key = (child.role, child.index)
        failures = 0 if now - child.started >= STABLE_AFTER_S else self.failures.get(key, 0) + 1
        self.failures[key] = failures
        return min(0.1 * (2**failures) if failures else 0.0, backoff_max_s)
