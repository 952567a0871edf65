"""A Debian tree booted with systemd as PID 1 (``systemd-nspawn --boot``), driven from the host.

These machines have no host systemd and no D-Bus, so nothing registers with machined (``--register=no``) and
nspawn stays in the caller's cgroup (``--keep-unit``); ``machinectl``/``systemd-run --machine`` cannot reach it.
Commands run in the container's namespaces instead: ``nsenter -t <its PID 1> -a``. The container shares the
host's network namespace (no ``--private-network``): what it binds, the host sees, and host servers on loopback
are its loopback too. Its root is an overlay over the cached tree (``tests.debian_tree.overlay_argv``), so a
boot writes only to its scratch directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.debian_tree import overlay_argv

CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MACHINE = "sentin8-boot-test"  # one at a time (tests.debian_tree.locked): nspawn keeps a /run dir per name


class BootFailed(RuntimeError):
    """systemd did not come up in the container: this machine cannot run the test (the message says why)."""


class Container:
    def __init__(self, tree: Path, scratch: Path, binds: dict[str, str]) -> None:
        """``binds``: host path -> container path, read-only."""
        self.scratch = scratch
        scratch.mkdir(parents=True, exist_ok=True)
        self.log_path = scratch / "console.log"
        argv = [
            "systemd-nspawn",
            "--quiet",
            "--register=no",
            "--keep-unit",
            "--boot",
            f"--machine={MACHINE}",
            "--console=read-only",
            "--directory={root}",
            *(f"--bind-ro={host}:{inside}" for host, inside in binds.items()),
        ]
        self._log = open(self.log_path, "w")  # noqa: SIM115 - lives as long as the container
        # nspawn halts the container on SIGTERM: if the test process dies, no container is left holding :443
        # (setpriv, not preexec_fn: the test process has threads; the signal survives the execs to nspawn)
        self.proc = subprocess.Popen(
            ["setpriv", "--pdeathsig", "SIGTERM", *overlay_argv(tree, scratch, argv)], stdin=subprocess.DEVNULL,
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.pid1 = 0  # the container's PID 1 (systemd), as the host numbers it

    def console(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def _find_pid1(self) -> int:
        """The child of nspawn that is PID 1 of its own PID namespace."""
        for child in Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split():
            with contextlib.suppress(OSError):
                status = Path(f"/proc/{child}/status").read_text()
                nspid = next(ln for ln in status.splitlines() if ln.startswith("NSpid:")).split()
                if len(nspid) > 2 and nspid[-1] == "1":
                    return int(child)
        return 0

    def boot(self, timeout: float = 120) -> float:
        """Wait until systemd reports the boot finished; the seconds it took. ``BootFailed`` otherwise."""
        start = time.monotonic()
        deadline = start + timeout
        while True:  # no event to wait on: another process's state, polled with a deadline
            if self.proc.poll() is not None:
                raise BootFailed(f"systemd-nspawn exited {self.proc.returncode}:\n{self.console()}")
            if not self.pid1:
                with contextlib.suppress(OSError):
                    self.pid1 = self._find_pid1()
            if self.pid1:
                # --wait blocks until start-up is over; before PID 1 listens it fails at once and we retry
                state = self.run("systemctl", "is-system-running", "--wait", check=False, timeout=timeout).stdout
                if state.strip() in ("running", "degraded"):
                    return time.monotonic() - start
            if time.monotonic() > deadline:
                raise BootFailed(f"systemd did not finish booting within {timeout:.0f} s:\n{self.console()}")
            time.sleep(0.1)

    def run(
        self, *argv: str, check: bool = True, timeout: float = 60, env: dict[str, str] | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` inside the container (all its namespaces, its root), with a clean environment."""
        cmd = ["nsenter", "-t", str(self.pid1), "-a", "env", "-i", f"PATH={CONTAINER_PATH}", "LANG=C.UTF-8",
               "HOME=/root", *(f"{k}={v}" for k, v in (env or {}).items()), *argv]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=input)
        if check and done.returncode != 0:
            raise AssertionError(f"in the container: {' '.join(argv)} exited {done.returncode}:\n"
                                 f"{done.stdout}{done.stderr}")
        return done

    def sh(self, script: str, **kw) -> subprocess.CompletedProcess[str]:
        return self.run("sh", "-euc", script, **kw)

    def poweroff(self, timeout: float = 60) -> int | None:
        """A clean halt (nspawn turns SIGTERM into systemd's halt); SIGKILL past ``timeout``. nspawn's exit."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                if self.pid1:  # its PID namespace ends with its PID 1
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.pid1, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
        # its mount namespace ended with it: the overlay is unmounted and its ~100 MB upper layer can go
        for layer in ("upper", "work"):
            shutil.rmtree(self.scratch / layer, ignore_errors=True)
        return self.proc.returncode
