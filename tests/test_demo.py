"""``sentin8-proxy demo`` as an operator runs it: a subprocess on free ports; then every command its banner
prints (``  $ `` lines), run by a shell as pasted, with what each must show. The L7 commands connect from
127.0.0.2, which the demo's config leaves outside ``network.internal_cidrs``: the edge is what answers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.peers import free_port, wait_until

CRS = Path("/usr/share/modsecurity-crs/rules")


@pytest.fixture
def demo(tmp_path):
    log = tmp_path / "demo.log"
    env = {**os.environ, "SENTIN8_MGMT_JWT_SECRET": ""}  # the demo makes its own
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor.cli", "demo", "--https-port", str(free_port("0.0.0.0")),
             "--workers", "1"],
            cwd=tmp_path, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env=env,
        )  # fmt: skip
    try:
        wait_until(lambda: '"event":"ready"' in log.read_text() or proc.poll() is not None, 60, 0.1, what="ready")
        assert proc.poll() is None, log.read_text()
        yield log.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as the banner says: drains and stops
        try:
            assert proc.wait(30) == 0, log.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)


def _sh(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60, cwd="/")


def test_every_printed_command_works_as_printed(demo):
    commands = [line.removeprefix("  $ ") for line in demo.splitlines() if line.startswith("  $ ")]
    waf = CRS.is_dir()
    assert len(commands) == (5 if waf else 4), demo
    l4, l7 = commands[0], commands[1]
    blocked = commands[2] if waf else None
    limited, unknown = commands[-2], commands[-1]

    out = _sh(l4)  # the L4 pipe: stock curl talks TLS with the demo backend itself
    assert out.returncode == 0, out
    assert "hello from the demo backend (its own TLS, reached through the L4 pipe)" in out.stdout
    assert "X-Sentin8" not in out.stdout  # never decrypted, never injected

    out = _sh(l7)  # the edge: PQ TLS terminated, context injected, the backend echoes it
    assert out.returncode == 0, out
    for shown in ("* group:      X25519MLKEM768", "* signature:  mldsa65", "* ALPN:       http/1.1",
                  "* verified:   yes (chain and name", "* subject:    CN=app.sentin8.test", "< HTTP/1.1 200 OK",
                  "plain HTTP, behind the L7 edge", "X-Sentin8-Service: app", "X-Sentin8-Hostname: app.sentin8.test",
                  "X-Sentin8-Env-Id: env-demo", "X-Sentin8-App-Id: app-shop", "X-Sentin8-Caller-Service: external",
                  "X-Sentin8-Correlation-Id: proxy-", "X-Forwarded-For: 127.0.0.2"):  # fmt: skip
        assert shown in out.stdout, (shown, out.stdout)

    if blocked is not None:
        out = _sh(blocked)
        assert out.returncode == 0 and "< HTTP/1.1 403 Forbidden" in out.stdout, out
        assert "hello from the demo backend" not in out.stdout  # stopped at the edge

    out = _sh(limited)
    assert out.returncode == 0, out
    assert ": 429 Too Many Requests" in out.stdout and "* statuses:   200 x" in out.stdout, out.stdout

    out = _sh(unknown)  # fail closed: no default mapping
    assert out.returncode != 0 and "hello" not in out.stdout

    # --http2: the edge serves h2 by default ([http2] enabled), and the request is answered over it
    out = _sh(l7.replace(" probe ", " probe --http2 ", 1))
    assert out.returncode == 0, out
    assert "* ALPN:       h2" in out.stdout and "falling back" not in out.stdout, out.stdout
    assert "< HTTP/2 200" in out.stdout or "< HTTP/2 429" in out.stdout, out.stdout
