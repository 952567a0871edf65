"""A cached Debian 12 tree with systemd, and the project's pinned dependencies as wheels, for booting the unit
under a real systemd (``tests/test_systemd_boot.py``).

Like ``bench/toolchain.py``'s Debian 13 tree: built once with mmdebstrap, aside and then renamed into place (an
interrupted build never looks finished), kept outside the repo and reused. Bookworm, the host's release, so its
Python is the same minor version as the host's and a wheel built here installs there.

The cache is never written by a run: every use mounts an overlay over the tree in a private mount namespace
(``overlay_argv``), so the mounts vanish with the process and a crashed run leaves nothing mounted. One lock
(``locked``) serialises every user on the machine: builds, and boots (which bind the host's :443).

The wheelhouse holds the dependencies of ``pyproject.toml`` (and the build backend) as wheels, resolved by the
tree's own pip, once per dependency set: the install inside the container, and the project's wheel built on the
host, then run offline and in seconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("SENTIN8_SYSTEMD_CACHE", "/var/cache/sentin8-systemd"))
SUITE = "bookworm"
# systemd + dbus to boot; python3-venv for the README's venv; iproute2 (ss) and procps for the checks;
# modsecurity-crs: the rules the WAF loads (policy.waf_crs_dir's default), so the WAF runs under the sandbox too
PACKAGES = ("systemd", "dbus", "python3", "python3-venv", "iproute2", "procps", "modsecurity-crs")
BUILD_BACKEND = "setuptools==80.9.0"  # pyproject's build-system asks for setuptools>=68: one exact version here
STAMP = ".sentin8-packages"
TREE_TIMEOUT_S = 1200
WHEELS_TIMEOUT_S = 600
WHEELHOUSE_KEEP_S = 14 * 86400  # wheelhouses of other dependency sets (other branches) unused this long go


class BuildError(RuntimeError):
    """The tree or the wheelhouse could not be built here (no mirror, no PyPI): the message says why."""


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Machine-wide: one builder or booted container at a time (other worktrees run the suite too)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run_logged(
    argv: list[str], log: IO[str], timeout: float, what: str, error: type[Exception] = BuildError, **kw
) -> None:
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    try:
        done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, **kw)
    except subprocess.TimeoutExpired:
        raise error(f"{what}: no result after {timeout:.0f} s") from None
    if done.returncode != 0:
        raise error(f"{what} failed (exit {done.returncode})")


def _replace(built: Path, final: Path) -> None:
    """``built`` takes ``final``'s place in two renames: an old copy is removed only once the new one is in."""
    old = final.with_name(final.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        final.rename(old)
    built.rename(final)
    if old.exists():
        shutil.rmtree(old)


def ensure_tree(log: IO[str]) -> tuple[Path, float | None]:
    """The tree (built when absent or built with other packages); and the seconds a build took, None if cached.
    Call it under ``locked()``."""
    root = CACHE / SUITE
    wanted = ",".join(PACKAGES)
    with contextlib.suppress(OSError):
        if (root / STAMP).read_text() == wanted:
            return root, None
    if shutil.which("mmdebstrap") is None:  # ./dev installs it: a green run must not hide a missing install step
        raise FileNotFoundError("mmdebstrap is not installed (Debian: mmdebstrap)")
    tmp = root.with_name(root.name + ".building")
    if tmp.exists():
        shutil.rmtree(tmp)
    start = time.monotonic()
    _run_logged(
        [
            "mmdebstrap",
            "--variant=apt",
            f"--include={wanted}",
            # mirrors may serve a frozen snapshot whose Release files have expired (as bench/toolchain.py)
            '--aptopt=Acquire::Check-Valid-Until "false"',
            '--aptopt=Acquire::Check-Date "false"',
            SUITE,
            str(tmp),
        ],
        log,
        TREE_TIMEOUT_S,
        f"mmdebstrap {SUITE}",
    )
    (tmp / STAMP).write_text(wanted)
    _replace(tmp, root)
    return root, time.monotonic() - start


def requirements() -> list[str]:
    """What the wheelhouse must hold: the project's pinned dependencies and the build backend with what else
    the build asks for (Cython: the wheel carries the compiled hot path)."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    build = [r for r in pyproject["build-system"]["requires"] if not r.startswith("setuptools")]
    return [*pyproject["project"]["dependencies"], BUILD_BACKEND, *build]


def overlay_argv(lower: Path, scratch: Path, argv: list[str], setup: str = "") -> list[str]:
    """``argv`` run in a private mount namespace where ``scratch/root`` is ``lower`` with a writable overlay
    (``scratch/upper``); ``setup`` (shell, ``$r`` = the root) runs first. "{root}" in ``argv`` is the root."""
    for d in ("upper", "work", "root"):
        (scratch / d).mkdir(parents=True, exist_ok=True)
    root = scratch / "root"
    script = (
        'set -e; r="$1"; shift; '
        f'mount -t overlay overlay -o "lowerdir={lower},upperdir={scratch}/upper,workdir={scratch}/work" "$r"; '
        f"{setup + '; ' if setup else ''}exec \"$@\""
    )
    args = [a.replace("{root}", str(root)) for a in argv]
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(root), *args]


def ensure_wheelhouse(tree: Path, log: IO[str], scratch: Path) -> Path:
    """The wheels of ``requirements()`` for the tree's Python, built by its own pip (PyPI, through the host's
    trust store); cached per dependency set. Call it under ``locked()``."""
    reqs = requirements()
    key = hashlib.sha256("\n".join([SUITE, *reqs]).encode()).hexdigest()[:12]
    house = CACHE / f"wheels-{key}"
    for other in CACHE.glob("wheels-*"):
        if other != house and other.is_dir() and time.time() - other.stat().st_mtime > WHEELHOUSE_KEEP_S:
            shutil.rmtree(other, ignore_errors=True)
    if house.is_dir():
        os.utime(house)  # in use: kept by the pruning above
        return house
    tmp = house.with_name(house.name + ".building")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    ca = "/etc/ssl/certs/ca-certificates.crt"  # the host's: the tree has no CA bundle (no ca-certificates)
    setup = (
        'mount -t proc proc "$r/proc"; mount --rbind /dev "$r/dev"; '
        'cp -L /etc/resolv.conf "$r/etc/resolv.conf"; '
        f'mkdir -p "$r/etc/ssl/certs" "$r/wheels"; cp -L {ca} "$r{ca}"; '
        f'mount --bind {tmp} "$r/wheels"'
    )
    venv = ["chroot", "{root}", "python3", "-m", "venv", "/tmp/pip"]
    wheel = ["chroot", "{root}", "/tmp/pip/bin/pip", "wheel", "--no-cache-dir", "-q", "-w", "/wheels", *reqs]
    script = f"{' '.join(venv)} && exec {' '.join(_quote(a) for a in wheel)}"
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "PIP_CERT": ca,
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_CONFIG_FILE": os.devnull}
    _run_logged(overlay_argv(tree, scratch, ["sh", "-c", script], setup), log, WHEELS_TIMEOUT_S,
                "pip wheel (the pinned dependencies, from PyPI)", env=env)
    tmp.rename(house)
    return house


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


_NOT_SHIPPED = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", "build", "dist", "*.egg-info", "*.so", "native.stamp", ".pytest_cache",
    ".ruff_cache", ".hypothesis", "results",
)


def build_wheel(wheelhouse: Path, out: Path, log: IO[str]) -> Path:
    """``pip wheel --no-deps`` of the working tree (a clean copy: no stale ``build/``, no compiled modules),
    with the build backend from the wheelhouse: offline. The compiled wheel, as the install block builds it."""
    src = out / "src"
    shutil.copytree(REPO, src, ignore=_NOT_SHIPPED)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(out), "PIP_CONFIG_FILE": os.devnull,
           "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    dist = out / "dist"
    # a failure here is the project's own (its packaging), not the machine's: an AssertionError, never a skip
    # 900 s: it compiles the hot path (setup.py), ~5 min of gcc on 2 busy cores
    _run_logged([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)], log, 900,
                "pip wheel (the project)", AssertionError, env=env)
    wheels = sorted(dist.glob("sentin8_proxy-*.whl"))
    if len(wheels) != 1:
        raise AssertionError(f"pip wheel made {[w.name for w in wheels]}, expected one sentin8_proxy wheel")
    return wheels[0]
