"""CPU time and RSS of process trees, straight from /proc (the peers are separate programs: no psutil hooks)."""

from __future__ import annotations

import contextlib
import os

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as fh:
        # the command name may hold spaces and parentheses: split after the last ")"
        return fh.read().rsplit(")", 1)[1].split()


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if int(_stat_fields(int(entry))[1]) == pid:
                    out.append(int(entry))
    return out


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants alive now."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children(p))
    return found


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of ``pids`` (threads included); a pid that is gone counts zero."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError):
            f = _stat_fields(pid)
            total += (int(f[11]) + int(f[12])) / _TICK
    return total


def cpu_split(pids: list[int]) -> tuple[float, float, int]:
    """(utime, stime, minor page faults) of ``pids``: user and kernel CPU seconds apart."""
    user = system = 0.0
    faults = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError):
            f = _stat_fields(pid)
            user += int(f[11]) / _TICK
            system += int(f[12]) / _TICK
            faults += int(f[7])
    return user, system, faults


def cpu_seconds_with_reaped(pid: int) -> float:
    """utime + stime + the reaped children's (cutime + cstime) of ``pid`` and every live descendant: all the
    CPU that ``pid``'s family has used, including short-lived tools that already exited."""
    total = 0.0
    for p in tree(pid):
        with contextlib.suppress(OSError, IndexError):
            f = _stat_fields(p)
            total += (int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])) / _TICK
    return total


def machine_busy_seconds() -> float:
    """CPU seconds every CPU spent not idle since boot (all processes, ours and others')."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / _TICK


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError), open(f"/proc/{pid}/statm") as fh:
            total += int(fh.read().split()[1]) * _PAGE
    return total


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def pin(cpus: set[int]) -> None:
    """Pin the calling process; CPUs that do not exist are dropped (never pin to nothing)."""
    usable = cpus & os.sched_getaffinity(0)
    if usable:
        os.sched_setaffinity(0, usable)
