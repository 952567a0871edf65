"""The ``[cluster]`` section (issue 19 §5): defaults, ``key: reason`` errors, the secret checked before anything
binds (exit 2 naming ``cluster.secret_env``), and ``/health``'s cluster field when cluster mode is off."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from sentin8.cluster.secret import load_secret
from sentin8.config import ConfigError, load_bytes
from tests.peers import REPO, free_port


def test_defaults():
    cfg = load_bytes(b"")
    cl = cfg.cluster
    assert (cl.enabled, cl.valkey_url, cl.cluster_id, cl.node_id) == (False, "", "default", "")
    assert (cl.sync_interval_ms, cl.fallback, cl.secret_env) == (50, "per_host", "SENTIN8_CLUSTER_SECRET")
    assert cfg.cluster_valkey_url() == cfg.sources.valkey_url  # empty = the sources' Valkey
    assert cfg.cluster_node_id() == f"{socket.gethostname()}:443"  # empty = hostname:port of listen.https
    cfg = load_bytes(b'[cluster]\nvalkey_url = "redis://10.0.0.5:6379/2"\nnode_id = "edge-7"\n')
    assert cfg.cluster_valkey_url() == "redis://10.0.0.5:6379/2" and cfg.cluster_node_id() == "edge-7"


@pytest.mark.parametrize(
    "toml, key",
    [
        (b'[cluster]\nenabled = "yes"\n', "cluster.enabled"),
        (b'[cluster]\nfallback = "off"\n', "cluster.fallback"),
        (b"[cluster]\nsync_interval_ms = 5\n", "cluster.sync_interval_ms"),
        (b"[cluster]\nsync_interval_ms = 60000\n", "cluster.sync_interval_ms"),
        (b'[cluster]\ncluster_id = ""\n', "cluster.cluster_id"),
        (b'[cluster]\ncluster_id = "a}b"\n', "cluster.cluster_id"),
        (b'[cluster]\nnode_id = "has space"\n', "cluster.node_id"),
        (b'[cluster]\nvalkey_url = "http://x"\n', "cluster.valkey_url"),
        (b'[cluster]\nsecret_env = "1BAD"\n', "cluster.secret_env"),
        (b"[cluster]\nbogus = 1\n", "cluster.bogus"),
    ],
)
def test_errors_name_the_key(toml, key):
    with pytest.raises(ConfigError) as info:
        load_bytes(toml)
    assert str(info.value).startswith(f"{key}:"), str(info.value)


def test_the_secret_is_required_and_at_least_32_bytes():
    cl = load_bytes(b"[cluster]\nenabled = true\n").cluster
    with pytest.raises(ConfigError, match=r"^cluster\.secret_env: environment variable SENTIN8_CLUSTER_SECRET"):
        load_secret(cl, {})
    with pytest.raises(ConfigError, match=r"^cluster\.secret_env: .* 31 bytes"):
        load_secret(cl, {"SENTIN8_CLUSTER_SECRET": "x" * 31})
    assert load_secret(cl, {"SENTIN8_CLUSTER_SECRET": "x" * 32}) == b"x" * 32


@pytest.mark.parametrize("secret", [None, "short"])
def test_run_without_a_usable_secret_exits_2_before_binding(tmp_path, secret):
    port = free_port()
    path = tmp_path / "cluster.toml"
    path.write_text(
        f'[listen]\nhttps = "127.0.0.1:{port}"\nhttp = ""\nmgmt = ""\n[tls]\nstate_dir = "{tmp_path}"\n'
        "[cluster]\nenabled = true\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SENTIN8_CLUSTER_SECRET"}
    if secret is not None:
        env["SENTIN8_CLUSTER_SECRET"] = secret
    out = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "run", "--config", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert out.returncode == 2, out.stderr
    assert "cluster.secret_env:" in out.stderr
    with socket.socket() as s:  # nothing bound the port
        s.bind(("127.0.0.1", port))


# ---- the secret from a systemd credential (LoadCredential=, $CREDENTIALS_DIRECTORY) -------------------------

CRED = "sentin8-cluster-secret"


def test_a_systemd_credential_wins_over_the_environment_and_loses_its_line_ending(tmp_path):
    cl = load_bytes(b"[cluster]\nenabled = true\n").cluster
    assert cl.secret_credential == CRED
    (tmp_path / CRED).write_bytes(b"c" * 40 + b"\n")  # written by echo
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path), "SENTIN8_CLUSTER_SECRET": "e" * 40}
    assert load_secret(cl, env) == b"c" * 40
    (tmp_path / CRED).write_bytes(b"c" * 40 + b"\r\n")
    assert load_secret(cl, env) == b"c" * 40
    (tmp_path / CRED).write_bytes(b"c" * 40)
    assert load_secret(cl, {"CREDENTIALS_DIRECTORY": str(tmp_path)}) == b"c" * 40  # no variable needed
    # no such credential in this unit: the variable, as without systemd
    assert load_secret(cl, {**env, "CREDENTIALS_DIRECTORY": str(tmp_path / "none")}) == b"e" * 40
    assert load_secret(cl, {"SENTIN8_CLUSTER_SECRET": "e" * 40}) == b"e" * 40  # no systemd credentials at all
    # another name, or credentials off ("")
    other = load_bytes(b'[cluster]\nsecret_credential = "edge.cluster"\n').cluster
    (tmp_path / "edge.cluster").write_bytes(b"o" * 32)
    assert load_secret(other, env) == b"o" * 32
    off = load_bytes(b'[cluster]\nsecret_credential = ""\n').cluster
    assert load_secret(off, env) == b"e" * 40


def test_credential_errors_name_the_key_and_the_reason(tmp_path):
    cl = load_bytes(b"[cluster]\nenabled = true\n").cluster
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path), "SENTIN8_CLUSTER_SECRET": "e" * 40}
    (tmp_path / CRED).write_bytes(b"short\n")
    with pytest.raises(ConfigError, match=r"^cluster\.secret_credential: the secret in the credential .* is 5 bytes"):
        load_secret(cl, env)  # a short credential is an error, not a reason to use the variable
    (tmp_path / CRED).write_bytes(b"")
    with pytest.raises(ConfigError, match=r"^cluster\.secret_credential: .* is 0 bytes"):
        load_secret(cl, env)
    (tmp_path / CRED).unlink()
    (tmp_path / CRED).mkdir()  # unreadable as a file
    with pytest.raises(
        ConfigError, match=r"^cluster\.secret_credential: cannot read the credential .*: Is a directory"
    ):
        load_secret(cl, env)
    with pytest.raises(
        ConfigError,
        match=r"^cluster\.secret_env: environment variable SENTIN8_CLUSTER_SECRET is not set and no credential "
        r"'sentin8-cluster-secret' in \$CREDENTIALS_DIRECTORY",
    ):
        load_secret(cl, {"CREDENTIALS_DIRECTORY": str(tmp_path / "none")})
    for bad in ("..", "a/b", "has space"):
        with pytest.raises(ConfigError, match=r"^cluster\.secret_credential: not a systemd credential name"):
            load_bytes(f'[cluster]\nsecret_credential = "{bad}"\n'.encode())


def test_run_with_a_short_credential_exits_2_naming_it_before_binding(tmp_path):
    port = free_port()
    path = tmp_path / "cluster.toml"
    path.write_text(
        f'[listen]\nhttps = "127.0.0.1:{port}"\nhttp = ""\nmgmt = ""\n[tls]\nstate_dir = "{tmp_path}"\n'
        "[cluster]\nenabled = true\n"
    )
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / CRED).write_text("too short\n")
    env = {**os.environ, "CREDENTIALS_DIRECTORY": str(creds), "SENTIN8_CLUSTER_SECRET": "e" * 40}
    out = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "run", "--config", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert out.returncode == 2, out.stderr
    assert "cluster.secret_credential: the secret in the credential" in out.stderr, out.stderr
    with socket.socket() as s:  # nothing bound the port
        s.bind(("127.0.0.1", port))
