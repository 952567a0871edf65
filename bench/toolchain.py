"""A post-quantum-capable wrk, h2load, nginx, HAProxy and openssl for the benchmarks.

Debian 12 links OpenSSL 3.0, which has neither X25519MLKEM768 nor ML-DSA. Debian 13 links 3.5, which has
both, so we build a Debian 13 tree once with mmdebstrap, cache it outside the repo, and run its tools with
``chroot`` against loopback (the chroot shares the host's network namespace). When the host's own OpenSSL is
already 3.5+ and the tools are installed, the host's are used instead.

Every chroot'd command runs in a private mount namespace (``unshare --mount``): /proc, /dev and the bench's
work directory are mounted there and vanish with the process, so nothing leaks into the host's mount table.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

CACHE = Path(os.environ.get("SENTIN8_BENCH_CACHE", "/var/cache/sentin8-bench"))
# Debian 13's nginx-light builds `stream` as a dynamic module, packaged apart
PACKAGES = "wrk,nghttp2-client,nginx-light,libnginx-mod-stream,haproxy,openssl"
TOOLS = ("wrk", "h2load", "nginx", "haproxy", "openssl")
HOSTS = ("bench.test",)  # names the clients put in SNI; resolved to loopback inside the tree


def _openssl_at_least(binary: list[str], major: int, minor: int) -> bool:
    try:
        out = subprocess.run([*binary, "version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    m = re.search(r"OpenSSL (\d+)\.(\d+)", out)
    return bool(m) and (int(m[1]), int(m[2])) >= (major, minor)


@dataclass
class Toolchain:
    """How to start the PQ tools: ``root`` is the chroot, or None for the host's own binaries."""

    root: Path | None
    workdir: Path
    build_seconds: float | None = None  # set when this run built the tree
    versions: dict[str, str] = field(default_factory=dict)

    def argv(self, args: list[str]) -> list[str]:
        """The argv that runs ``args`` inside the toolchain, with the work dir visible at the same path."""
        if self.root is None:
            return args
        root, work = str(self.root), str(self.workdir)
        # sh -c with positional args: no quoting of user paths needed
        script = (
            'r="$1"; w="$2"; shift 2; '
            'mount -t proc proc "$r/proc" && '
            'mount --rbind /dev "$r/dev" && '
            'mkdir -p "$r$w" && mount --bind "$w" "$r$w" && '
            'exec chroot "$r" "$@"'
        )
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", root, work, *args]

    def run(self, args: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(args), capture_output=True, text=True, timeout=timeout, **kw)

    def popen(self, args: list[str], **kw) -> subprocess.Popen:
        # unshare and sh both exec, so the Popen pid ends up being the tool's own pid
        return subprocess.Popen(self.argv(args), **kw)

    def collect_versions(self) -> dict[str, str]:
        probes = {
            "openssl": ["openssl", "version"],
            "nginx": ["nginx", "-v"],
            "haproxy": ["haproxy", "-v"],
            "h2load": ["h2load", "--version"],
            "wrk": ["wrk", "-v"],
        }
        for name, argv in probes.items():
            res = self.run(argv, timeout=30)
            text = (res.stdout + res.stderr).strip().splitlines()
            self.versions[name] = text[0].strip() if text else f"unknown (exit {res.returncode})"
        if self.root is not None:
            os_release = (self.root / "etc/os-release").read_text()
            m = re.search(r'^PRETTY_NAME="(.*)"', os_release, re.M)
            self.versions["chroot"] = f"{m[1] if m else 'unknown'} at {self.root}"
        return self.versions


def _build_tree(root: Path, log) -> float:
    """mmdebstrap a Debian stable tree into ``root`` (atomically: build aside, then rename)."""
    if shutil.which("mmdebstrap") is None:
        print("bench: installing mmdebstrap with apt-get", file=log, flush=True)
        subprocess.run(["apt-get", "update", "-qq"], check=True, stdout=log, stderr=log)
        subprocess.run(["apt-get", "install", "-y", "-qq", "mmdebstrap"], check=True, stdout=log, stderr=log)
    tmp = root.with_name(root.name + ".building")
    if tmp.exists():
        shutil.rmtree(tmp)
    root.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    print(f"bench: building {root} with mmdebstrap (once; cached)", file=log, flush=True)
    subprocess.run(
        [
            "mmdebstrap",
            "--variant=apt",
            f"--include={PACKAGES}",
            # mirrors may serve a frozen snapshot whose Release files have expired; the host's apt accepts
            # them the same way
            '--aptopt=Acquire::Check-Valid-Until "false"',
            '--aptopt=Acquire::Check-Date "false"',
            "stable",
            str(tmp),
        ],
        check=True,
        stdout=log,
        stderr=log,
    )
    tmp.rename(root)
    return time.monotonic() - start


def add_packages(root: Path, wanted: tuple[tuple[str, str], ...], log) -> None:
    """Install into the tree each package of ``wanted`` ((a file it ships, the package)) whose file is absent."""
    missing = [pkg for path, pkg in wanted if not (root / path).exists()]
    if missing:
        print(f"bench: adding {' '.join(missing)} to the cached tree", file=log, flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
            subprocess.run(["chroot", str(root), *argv], check=True, stdout=log, stderr=log, env=env)


def _prepare_tree(root: Path, log) -> None:
    """Packages a tree cached by an older bench lacks, hosts entries for the SNI names; idempotent."""
    # (module file, package): packages a tree cached by an older bench lacks
    wanted = (
        ("usr/lib/nginx/modules/ngx_stream_module.so", "libnginx-mod-stream"),
        # nginx beside sentin8's WAF: the same ModSecurity v3 engine (bench.waf_l7 gives it the same CRS rules)
        ("usr/lib/nginx/modules/ngx_http_modsecurity_module.so", "libnginx-mod-http-modsecurity"),
    )
    add_packages(root, wanted, log)
    hosts = root / "etc/hosts"
    text = hosts.read_text() if hosts.exists() else "127.0.0.1 localhost\n"
    for name in HOSTS:
        if not re.search(rf"\s{re.escape(name)}(\s|$)", text):
            text += f"127.0.0.1 {name}\n"
    hosts.write_text(text)
    # the packaged services are never started in the tree; keep their default sites out of the way
    for path in ("etc/nginx/sites-enabled/default",):
        p = root / path
        if p.exists() or p.is_symlink():
            p.unlink()


def ensure(workdir: Path, log=None, force_chroot: bool = False) -> Toolchain:
    """The toolchain to use: the host's when it is PQ-capable, else the cached Debian 13 tree (built if absent)."""
    host_ok = (
        not force_chroot
        and all(shutil.which(t) for t in TOOLS)
        # Debian's tools link the system libssl, whose version the openssl binary reports
        and _openssl_at_least(["openssl"], 3, 5)
    )
    if host_ok:
        tc = Toolchain(None, workdir)
    else:
        root = CACHE / "trixie"
        built = None
        if not (root / "usr/sbin/nginx").exists():
            built = _build_tree(root, log)
        _prepare_tree(root, log)
        tc = Toolchain(root, workdir, build_seconds=built)
    tc.collect_versions()
    return tc
