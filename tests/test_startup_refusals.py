"""Starting wrong fails loudly (issue 8 part 4): exit 2 and one ``key: reason`` line, before anything binds,
from ``check-config`` and from ``run`` alike; a second fleet on a taken port is refused naming the holder."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.peers import REPO, free_port


def write_config(tmp_path: Path, extra: str = "", port: int | None = None) -> Path:
    path = tmp_path / "proxy.toml"
    path.write_text(
        f"""
[listen]
https = "127.0.0.1:{port or free_port()}"
http = ""
mgmt = ""
[fleet]
workers = 1
drain_timeout_s = 2
[tls]
cert_dir = "{tmp_path}/certs"
state_dir = "{tmp_path}/state"
{extra}
"""
    )
    return path


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_line_refusal(out: subprocess.CompletedProcess, key: str) -> None:
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert f": {key}: " in lines[0], lines[0]


CASES = {
    "tls.client_ca_file": '[tls]\nclient_ca_file = "/nonexistent/clients-ca.pem"',
    "upstream.ca_file": '[upstream]\nca_file = "/nonexistent/upstream-ca.pem"',
    "upstream.client_cert": '[upstream]\nclient_cert = "/nonexistent/c.pem"\nclient_key = "/nonexistent/k.pem"',
    "sources.valkey_url": '[sources]\nregistry = "valkey"\nvalkey_url = "valkey:/127.0.0.1:6379"',
    "sources.postgres_dsn": '[sources]\ndomains = "postgres"\npostgres_dsn = "host=127.0.0.1 port=fivefour"',
}


@pytest.mark.parametrize("key", sorted(CASES))
def test_a_missing_file_or_malformed_url_is_one_line_and_exit_2(tmp_path, key):
    # the [tls] of the template and a case's [tls] would collide: cases with [tls] replace that section
    extra = CASES[key]
    path = write_config(tmp_path, "" if extra.startswith("[tls]") else extra)
    if extra.startswith("[tls]"):
        path.write_text(path.read_text().replace("[tls]", extra, 1))
    assert_one_line_refusal(cli("check-config", str(path)), key)
    t0 = time.monotonic()
    assert_one_line_refusal(cli("run", "--config", str(path)), key)
    assert time.monotonic() - t0 < 20  # refused at once, not after a restart loop


def test_a_pem_file_without_a_certificate_is_refused(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate\n")
    path = write_config(tmp_path)
    path.write_text(path.read_text().replace("[tls]", f'[tls]\nclient_ca_file = "{ca}"', 1))
    assert_one_line_refusal(cli("check-config", str(path)), "tls.client_ca_file")


def test_a_state_dir_the_service_user_cannot_write_is_refused(tmp_path):
    """The check as the unprivileged service user would run it (root writes anywhere): a forked child
    drops to ``nobody`` and runs the same check ``check-config`` and ``run`` use."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another user")
    from sentin8.config import ConfigError, load_file
    from sentin8.startup_checks import check_paths

    base = Path(tempfile.mkdtemp(prefix="s8-state-"))  # pytest's tmp_path is 0700: nobody could not reach it
    os.chmod(base, 0o755)
    (base / "state").mkdir(mode=0o755)  # root's: nobody may enter it, not write into it
    (base / "certs").mkdir(mode=0o755)
    cfg = load_file(str(write_config(base)))
    check_paths(cfg)  # root may: the same config passes
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(r)
            os.setgid(pwd.getpwnam("nobody").pw_gid)
            os.setuid(pwd.getpwnam("nobody").pw_uid)
            try:
                check_paths(cfg)
                os.write(w, b"accepted")
            except ConfigError as exc:
                os.write(w, str(exc).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        said = fh.read().decode()
    os.waitpid(pid, 0)
    shutil.rmtree(base)
    assert said.startswith("tls.state_dir: ") and "not writable" in said, said


def test_a_state_dir_that_is_a_file_is_refused_by_run(tmp_path):
    path = write_config(tmp_path)
    (tmp_path / "state").write_text("a file, not a directory")
    assert_one_line_refusal(cli("run", "--config", str(path)), "tls.state_dir")


def test_a_second_fleet_on_the_same_port_is_refused_naming_the_first(tmp_path, fleet_factory):
    first = fleet_factory("", workers=1)
    second_dir = tmp_path / "second"
    second_dir.mkdir()
    path = write_config(second_dir, port=first.port)
    out = cli("run", "--config", str(path))
    assert_one_line_refusal(out, "listen.https")
    assert "already in use by pid" in out.stderr and "sentin8-proxy" in out.stderr
    assert "--beside-running-fleet" in out.stderr  # the way to do it on purpose (an upgrade)


def test_a_ca_file_whose_body_is_garbage_is_refused_before_any_worker_starts(tmp_path):
    """A CA file that looks like PEM but whose body is garbage used to pass the checks and crash every
    worker five times before ``run`` gave up: it is loaded the way the workers load it, up front."""
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")
    path = write_config(tmp_path)
    path.write_text(path.read_text().replace("[tls]", f'[tls]\nclient_ca_file = "{ca}"', 1))
    assert_one_line_refusal(cli("check-config", str(path)), "tls.client_ca_file")
    t0 = time.monotonic()
    out = cli("run", "--config", str(path), timeout=60)
    assert_one_line_refusal(out, "tls.client_ca_file")
    assert "does not load" in out.stderr and "exited 5 times" not in out.stderr
    assert time.monotonic() - t0 < 20
