"""Reload and start-up edges (issue 16 items 14-17), each on the check-config, run and reload paths with its
exact exit code and its one ``key: reason`` line: a full ``tls.state_dir`` (a real ENOSPC, a tmpfs in a
private mount namespace), a state_dir moved in the file, listeners that collide with each other or with
another program, and files that look like PEM but do not load."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.mgmt_client import call, token
from tests.peers import free_port, roundtrip, wait_until
from tests.test_reload import FAST_DRAIN, mixed_body, run_cli
from tests.test_startup_refusals import assert_one_line_refusal, write_config


def reload_wait(fleet, *extra: str) -> subprocess.CompletedProcess:
    return run_cli("reload", "--config", fleet.config, "--wait", "--timeout", "30", *extra)


def one_line(out: subprocess.CompletedProcess) -> str:
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


# ---- 14: a full state_dir ------------------------------------------------------------------------------


def full_tmpfs_launcher(state: Path) -> tuple[str, ...]:
    """The fleet in a private mount namespace where ``state`` is a 64 KiB tmpfs filled to the last block."""
    script = 'mount -t tmpfs -o size=64k tmpfs "$0" && { cat /dev/zero > "$0/fill" 2>/dev/null; exec "$@"; }'
    return ("unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(state))


def test_a_full_state_dir_neither_stalls_reload_wait_nor_answers_a_policy_change_with_500(
    tmp_path, fleet_factory, backend_factory
):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs in a private mount namespace needs root")
    shop = backend_factory("shop", "shop.internal")
    state = tmp_path / "state"
    state.mkdir()
    fleet = fleet_factory(
        mixed_body(1, shop.port), workers=1, fleet=FAST_DRAIN, mgmt=True, launcher=full_tmpfs_launcher(state)
    )
    # the disk is really full, as the fleet sees it
    write = f"import os; fd = os.open('{state}/probe', os.O_WRONLY | os.O_CREAT); os.write(fd, b'x' * 4096)"
    probe = subprocess.run(
        ["nsenter", "-t", str(fleet.proc.pid), "-m", sys.executable, "-c", write], capture_output=True, text=True
    )
    assert "OSError: [Errno 28] No space left on device" in probe.stderr, probe.stderr
    assert one_line(out := reload_wait(fleet, "--pid", str(fleet.proc.pid))) == "sentin8-proxy reload: reload 1 done"
    assert out.returncode == 0
    out = reload_wait(fleet)  # found by its config, not by a file in the full directory
    assert (out.returncode, one_line(out)) == (0, "sentin8-proxy reload: reload 2 done")

    tok = token(fleet.secret)
    before = json.loads(call(fleet.mgmt_url, "GET", "/policy", tok)[2])
    for method, body in (("PUT", {"waf": True}), ("DELETE", None)):
        status, headers, raw = call(fleet.mgmt_url, method, "/policy", token(fleet.secret), body)  # a jti is used once
        answer = json.loads(raw)
        assert status == 503, (method, status, raw)
        assert answer["error"] == "not_saved" and headers.get("retry-after") == "30"
        assert answer["detail"] == (
            f"tls.state_dir: cannot save the policy in {state} (No space left on device): not applied"
        )
    after = json.loads(call(fleet.mgmt_url, "GET", "/policy", tok)[2])
    assert after == before  # not applied: what the workers use is what the disk says
    assert len(fleet.events("policy_not_saved")) == 2


# ---- 15: the state_dir moved in the file --------------------------------------------------------------


def test_reload_wait_finds_the_supervisor_by_its_pid_after_state_dir_moved_in_the_file(
    tmp_path, fleet_factory, backend_factory
):
    shop = backend_factory("shop", "shop.internal")
    fleet = fleet_factory(mixed_body(1, shop.port), workers=1, fleet=FAST_DRAIN)
    config = Path(fleet.config)
    old_state = f'state_dir = "{fleet.workdir}/state"'
    assert old_state in config.read_text()
    config.write_text(config.read_text().replace(old_state, f'state_dir = "{tmp_path}/moved"'))
    out = reload_wait(fleet, "--pid", str(fleet.proc.pid))
    assert (out.returncode, one_line(out)) == (0, "sentin8-proxy reload: reload 1 done")
    out = reload_wait(fleet)
    assert (out.returncode, one_line(out)) == (0, "sentin8-proxy reload: reload 2 done")
    assert [e["seq"] for e in fleet.events("reload_done")] == [1, 2]


def test_reload_wait_on_a_pid_that_is_no_supervisor_is_exit_2_and_signals_nothing(fleet_factory):
    fleet = fleet_factory("", workers=1)
    bystander = subprocess.Popen(["sleep", "60"])  # a SIGHUP would end it
    try:
        out = reload_wait(fleet, "--pid", str(bystander.pid))
        assert out.returncode == 2
        assert one_line(out) == (
            f"sentin8-proxy reload: pid {bystander.pid} holds no reload status: "
            "not a running sentin8-proxy supervisor (or not this user's)?"
        )
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


# ---- 16: listeners -----------------------------------------------------------------------------------


def test_listeners_on_one_address_are_refused_by_check_config_run_and_reload(tmp_path, fleet_factory):
    port = free_port()
    path = write_config(tmp_path, port=port)
    path.write_text(path.read_text().replace('http = ""', f'http = "0.0.0.0:{port}"'))
    line = f"listen.http: 0.0.0.0:{port} overlaps listen.https (127.0.0.1:{port}): each listener needs its own address"
    for args in (("check-config", str(path)), ("run", "--config", str(path))):
        out = run_cli(*args)
        assert_one_line_refusal(out, "listen.http")
        assert one_line(out) == f"sentin8-proxy: config error: {line}"

    fleet = fleet_factory("", workers=1, fleet=FAST_DRAIN)
    config = Path(fleet.config)
    good = config.read_text()
    config.write_text(good.replace('http = ""', f'http = "127.0.0.1:{fleet.port}"'))
    out = reload_wait(fleet)  # the reload command reads the file first: nothing is signalled
    assert out.returncode == 2
    assert one_line(out) == (
        f"sentin8-proxy: config error: listen.http: 127.0.0.1:{fleet.port} is also listen.https "
        f"(127.0.0.1:{fleet.port}): each listener needs its own address"
    )
    fleet.signal(signal.SIGHUP)  # kill -HUP reads it anyway: refused
    wait_until(lambda: fleet.saw("reload_refused"), 10, what="reload refused")
    assert fleet.events("reload_refused")[-1]["reason"].startswith(f"listen.http: 127.0.0.1:{fleet.port} is also")


def test_a_reload_onto_a_port_another_program_shares_with_so_reuseport_is_refused(fleet_factory, backend_factory):
    shop = backend_factory("shop", "shop.internal")
    fleet = fleet_factory(mixed_body(1, shop.port), workers=1, fleet=FAST_DRAIN)
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # the kind of holder a worker's bind would join
    other.bind(("127.0.0.1", 0))
    other.listen(8)
    taken = other.getsockname()[1]
    try:
        config = Path(fleet.config)
        config.write_text(config.read_text().replace(f"127.0.0.1:{fleet.port}", f"127.0.0.1:{taken}"))
        out = reload_wait(fleet)
        assert out.returncode == 1
        line = one_line(out)
        assert line.startswith(
            f"sentin8-proxy reload: reload 1 refused: listen.https: cannot listen on 127.0.0.1:{taken}: "
            f"already in use by pid {os.getpid()} "
        ), line
        assert roundtrip(fleet.port, "shop.internal") == b"shop:ping"  # the old listener serves on
        assert not fleet.saw("reload_start")
    finally:
        other.close()


def test_a_reload_that_moves_a_listener_onto_another_of_the_running_fleet_is_refused(fleet_factory):
    http_port = free_port()
    fleet = fleet_factory("", workers=1, fleet=FAST_DRAIN, http=f"127.0.0.1:{http_port}")
    config = Path(fleet.config)
    text = config.read_text()
    swapped = text.replace(f"127.0.0.1:{fleet.port}", "SWAP").replace(
        f"127.0.0.1:{http_port}", f"127.0.0.1:{fleet.port}"
    )
    config.write_text(swapped.replace("SWAP", f"127.0.0.1:{http_port}"))
    out = reload_wait(fleet)
    assert (out.returncode, one_line(out)) == (
        1,
        f"sentin8-proxy reload: reload 1 refused: listen.https: 127.0.0.1:{http_port} is listen.http of the "
        "running fleet: moving a listener there needs a restart",
    )


# ---- 17: files that look like PEM but do not load, a Valkey database that is not a number ----------------

GARBLED = "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"
GARBLED_KEY = "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5!!\n-----END PRIVATE KEY-----\n"


def bad_files(tmp_path: Path) -> dict[str, tuple[str, str, str]]:
    """key -> (the section, its lines, the start of the reason): each names a file that does not load."""
    from supervisor.demo import write_demo_cert

    cert, key = write_demo_cert(str(tmp_path), "client.internal")
    ca = tmp_path / "garbled-ca.pem"
    ca.write_text(GARBLED)
    bad_key = tmp_path / "garbled-key.pem"
    bad_key.write_text(GARBLED_KEY)
    return {
        "tls.client_ca_file": ("[tls]", f'client_ca_file = "{ca}"', f"tls.client_ca_file: {ca} does not load ("),
        "upstream.ca_file": ("[upstream]", f'ca_file = "{ca}"', f"upstream.ca_file: {ca} does not load ("),
        "upstream.client_cert": (
            "[upstream]",
            f'client_cert = "{ca}"\nclient_key = "{key}"',
            f"upstream.client_cert: {ca} does not load (",
        ),
        "upstream.client_key": (
            "[upstream]",
            f'client_cert = "{cert}"\nclient_key = "{bad_key}"',
            f"upstream.client_key: {bad_key} does not load (",
        ),
        "sources.valkey_url": (
            "[sources]",
            'registry = "valkey"\nvalkey_url = "redis://127.0.0.1:6379/x"',
            "sources.valkey_url: database 'x' in 'redis://127.0.0.1:6379/x' is not a number",
        ),
    }


def with_section(text: str, section: str, lines: str) -> str:
    if section in text:
        return text.replace(section, f"{section}\n{lines}", 1)
    return f"{text}\n{section}\n{lines}\n"


@pytest.mark.parametrize(
    "key",
    ["tls.client_ca_file", "upstream.ca_file", "upstream.client_cert", "upstream.client_key", "sources.valkey_url"],
)
def test_a_file_that_does_not_load_is_refused_by_check_config_and_run_at_once(tmp_path, key):
    section, lines, reason = bad_files(tmp_path)[key]
    path = write_config(tmp_path)
    path.write_text(with_section(path.read_text(), section, lines))
    for args in (("check-config", str(path)), ("run", "--config", str(path))):
        t0 = time.monotonic()
        out = run_cli(*args)
        assert_one_line_refusal(out, key)
        assert one_line(out).startswith(f"sentin8-proxy: config error: {reason}"), out.stderr
        assert time.monotonic() - t0 < 20  # before anything binds, not after five worker crashes


def test_a_reload_to_a_file_that_does_not_load_is_refused_and_the_old_config_serves(
    tmp_path, fleet_factory, backend_factory
):
    shop = backend_factory("shop", "shop.internal")
    fleet = fleet_factory(mixed_body(1, shop.port), workers=1, fleet=FAST_DRAIN)
    config = Path(fleet.config)
    good = config.read_text()
    cases = bad_files(tmp_path)
    for seq, (_key, (section, lines, reason)) in enumerate(sorted(cases.items()), start=1):
        config.write_text(with_section(good, section, lines))
        out = reload_wait(fleet)
        assert out.returncode == 1, out.stderr
        assert one_line(out).startswith(f"sentin8-proxy reload: reload {seq} refused: {reason}"), out.stderr
    assert roundtrip(fleet.port, "shop.internal") == b"shop:ping"  # the old config serves on
    config.write_text(good)
    out = reload_wait(fleet)
    assert (out.returncode, one_line(out)) == (0, f"sentin8-proxy reload: reload {len(cases) + 1} done")
