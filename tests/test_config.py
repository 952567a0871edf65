"""Configuration: every error names its key and reason; the CLI exits 2 before anything binds."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from sentin8.config import ConfigError, load_bytes
from tests.peers import REPO, free_port


def test_defaults_match_the_design():
    cfg = load_bytes(b"")
    assert cfg.listen.https == "0.0.0.0:443"
    assert cfg.limits.peek_max_bytes == 32768  # issue 16: one maximal TLS record (16,389 bytes) must fit
    assert cfg.policy.max_headers == 100 and cfg.policy.max_header_bytes == 65536
    assert cfg.sources.poll_interval_s == 30 and cfg.sources.suspect_ttl_s == 30
    assert "10.0.0.0/8" in cfg.network.internal_cidrs
    assert cfg.limits.max_request_body_bytes == 0  # no cap: bodies stream (docs/traffic.md, "Request bodies")
    assert cfg.http2.enabled is True  # docs/http2.md: h2 preferred when a client offers it
    assert load_bytes(b"[http2]\nenabled = false\n").http2.enabled is False
    assert cfg.listen.proxy_protocol_from == []  # no balancer trusted: a PROXY header is refused from anyone


def test_proxy_protocol_keys():
    cfg = load_bytes(
        b'[listen]\nproxy_protocol_from = ["10.9.0.0/16", "2001:db8::7"]\n'
        b'[[instances]]\nservice = "a"\nid = "x"\nhost = "1.2.3.4"\nport = 1\nproxy_protocol = "v2"\n'
    )
    assert cfg.listen.proxy_protocol_from == ["10.9.0.0/16", "2001:db8::7"]
    assert cfg.instances[0].proxy_protocol == "v2"
    assert (
        load_bytes(b'[[instances]]\nservice = "a"\nid = "x"\nhost = "1.2.3.4"\nport = 1\n').instances[0].proxy_protocol
        == ""
    )


@pytest.mark.parametrize(
    "toml, key",
    [
        (b"[listen]\nhttps = 443\n", "listen.https"),
        (b'[listen]\nhttps = "nohost"\n', "listen.https"),
        (b'[listen]\nhttps = "example.com:443"\n', "listen.https"),
        (b'[listen]\nhttp = "1.2.3.4:99999"\n', "listen.http"),
        (b"[listen]\nbogus = 1\n", "listen.bogus"),
        (b"bogus = 1\n", "bogus"),
        (b'[fleet]\nworkers = "two"\n', "fleet.workers"),
        (b"[fleet]\nworkers = -1\n", "fleet.workers"),
        (b'[network]\ninternal_cidrs = ["10.0.0.0/33"]\n', "network.internal_cidrs[0]"),
        (b'[listen]\nproxy_protocol_from = ["10.0.0.0/8", "lb.example"]\n', "listen.proxy_protocol_from[1]"),
        (b'[listen]\nproxy_protocol_from = "10.0.0.0/8"\n', "listen.proxy_protocol_from"),
        (
            b'[[instances]]\nservice = "a"\nid = "x"\nhost = "1.2.3.4"\nport = 1\nproxy_protocol = "v1"\n',
            "instances[0].proxy_protocol",
        ),
        (b'[sources]\nregistry = "etcd"\n', "sources.registry"),
        (b"[limits]\npeek_timeout_s = 0\n", "limits.peek_timeout_s"),
        (b"[limits]\nmax_request_body_bytes = -1\n", "limits.max_request_body_bytes"),
        (b'[limits]\nmax_request_body_bytes = "1M"\n', "limits.max_request_body_bytes"),
        (b'[http2]\nenabled = "yes"\n', "http2.enabled"),
        (b"[http2]\nbogus = 1\n", "http2.bogus"),
        (b"[shm]\nsuspect_slots = 1000\n", "shm.suspect_slots"),
        (b"[shm]\nmetrics_services = 1\n", "shm.metrics_services"),
        (b'[metrics]\nvalkey_url = "http://x"\n', "metrics.valkey_url"),
        (b'[metrics]\nchannel = ""\n', "metrics.channel"),
        (b"[metrics]\ninterval_s = 0\n", "metrics.interval_s"),
        (b'[log]\naccess = "yes"\n', "log.access"),
        (b'[[instances]]\nservice = "a"\nid = "x"\nhost = "localhost"\nport = 1\n', "instances[0].host"),
        (b'[[instances]]\nservice = "a"\nid = "x"\nport = 1\n', "instances[0].host"),
        (b'[[domains]]\nhostname = "bad name"\nservice = "a"\n', "domains[0].hostname"),
        (b"[policy]\nwaf_paranoia = 5\n", "policy.waf_paranoia"),
        (b"[policy]\nwaf_anomaly_threshold = 0\n", "policy.waf_anomaly_threshold"),
        (b"[policy]\nwaf_body_max = 10\n", "policy.waf_body_max"),
        (b'[policy]\nwaf_oversize = "truncate"\n', "policy.waf_oversize"),
        (b'[policy]\nrate_limit_key = "cookie"\n', "policy.rate_limit_key"),
        (b'[[policy.waf_exclusions]]\nhost = "bad host"\nrule_ids = [942100]\n', "policy.waf_exclusions[0].host"),
        (b'[[policy.waf_exclusions]]\nhost = "a.test"\nrule_ids = []\n', "policy.waf_exclusions[0].rule_ids"),
        (b"[listen\n", "<config>"),
    ],
)
def test_errors_name_the_key(toml, key):
    with pytest.raises(ConfigError) as info:
        load_bytes(toml)
    assert str(info.value).startswith(f"{key}:"), str(info.value)


def test_cli_check_config_prints_effective_config(tmp_path):
    path = tmp_path / "ok.toml"
    path.write_text("[fleet]\nworkers = 3\n")
    out = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "check-config", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0
    assert '"workers": 3' in out.stdout and '"https": "0.0.0.0:443"' in out.stdout


def test_cli_run_with_bad_config_exits_2_before_binding(tmp_path):
    port = free_port()
    path = tmp_path / "bad.toml"
    path.write_text(f'[listen]\nhttps = "127.0.0.1:{port}"\n[network]\ninternal_cidrs = ["nope"]\n')
    out = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "run", "--config", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2
    assert "network.internal_cidrs[0]" in out.stderr
    import socket

    with socket.socket() as s:  # nothing bound the port
        s.bind(("127.0.0.1", port))


def test_a_port_held_by_another_program_is_one_clear_line_and_exit_2(tmp_path):
    import socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)  # no SO_REUSEPORT: nobody else may bind it
    port = holder.getsockname()[1]
    path = tmp_path / "busy.toml"
    path.write_text(f'[listen]\nhttps = "127.0.0.1:{port}"\nhttp = ""\nmgmt = ""\n[tls]\nstate_dir = "{tmp_path}"\n')
    out = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "run", "--config", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    holder.close()
    assert out.returncode == 2
    assert f"listen.https: cannot listen on 127.0.0.1:{port}" in out.stderr


def test_a_waf_rule_set_that_does_not_load_exits_2_before_binding(tmp_path):
    from tests.crs_dirs import CRS_V3_RULES, crs_copy

    port = free_port()
    rules = crs_copy(tmp_path / "crs", CRS_V3_RULES)  # a real CRS with one broken file in it
    (rules / "REQUEST-942-BROKEN.conf").write_text('SecRule ARGS "@rx x" "id:1,phase:2,nosuchaction"\n')
    path = tmp_path / "waf.toml"
    path.write_text(
        f'[listen]\nhttps = "127.0.0.1:{port}"\nhttp = ""\nmgmt = ""\n[tls]\nstate_dir = "{tmp_path}"\n'
        f'[policy]\nwaf = true\nwaf_crs_dir = "{rules}"\n'
    )
    for command in (["run", "--config", str(path)], ["check-config", str(path)]):
        out = subprocess.run(
            [sys.executable, "-m", "supervisor.cli", *command], cwd=REPO, capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 2
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "policy.waf_crs_dir: REQUEST-942-BROKEN.conf:" in lines[0], out.stderr
    import socket

    with socket.socket() as s:  # nothing bound the port
        s.bind(("127.0.0.1", port))


def test_a_taken_internal_l4_port_is_reported_like_listen_https(tmp_path):
    import socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    https = free.getsockname()[1]
    free.close()
    path = tmp_path / "busy.toml"
    path.write_text(
        f'[listen]\nhttps = "127.0.0.1:{https}"\nhttp = ""\nmgmt = ""\ninternal_l4 = "127.0.0.1:{port}"\n'
        f'[tls]\nstate_dir = "{tmp_path}"\n'
    )
    out = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "run", "--config", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    holder.close()
    assert out.returncode == 2
    assert f"listen.internal_l4: cannot listen on 127.0.0.1:{port}" in out.stderr


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[tls]\nticket_key_rotation_s = 10\n", "tls.ticket_key_rotation_s: must be within 60..604800, got 10"),
        ('[listen]\ninternal_l4 = "nowhere"\n', "listen.internal_l4: 'nowhere' is not HOST:PORT"),
        (
            '[listen]\nhttps = "0.0.0.0:8443"\ninternal_l4 = "0.0.0.0:8443"\n',
            "listen.internal_l4: 0.0.0.0:8443 is also listen.https",
        ),
    ],
)
def test_issue13_keys_are_checked(text, error):
    with pytest.raises(ConfigError, match=re.escape(error)):
        load_bytes(text.encode())


def test_metrics_go_to_the_registry_valkey_unless_told_otherwise():
    assert load_bytes(b"").metrics_valkey_url() == ""  # file sources, no metrics.valkey_url: nothing published
    live = load_bytes(b'[sources]\nregistry = "valkey"\nvalkey_url = "redis://10.0.0.5:6379/0"\n')
    assert live.metrics_valkey_url() == "redis://10.0.0.5:6379/0"
    own = load_bytes(b'[metrics]\nvalkey_url = "redis://10.0.0.9:6379/1"\n[sources]\nregistry = "valkey"\n')
    assert own.metrics_valkey_url() == "redis://10.0.0.9:6379/1"


@pytest.mark.parametrize(
    ("listen", "error"),
    [
        ('http = "0.0.0.0:8443"', "listen.http: 0.0.0.0:8443 is also listen.https (0.0.0.0:8443)"),
        ('http = "127.0.0.1:8443"', "listen.http: 127.0.0.1:8443 overlaps listen.https (0.0.0.0:8443)"),
        ('mgmt = "[::]:8443"', "listen.mgmt: [::]:8443 overlaps listen.https (0.0.0.0:8443)"),
        ('http = "127.0.0.1:8080"\nmgmt = "127.0.0.1:8080"', "listen.mgmt: 127.0.0.1:8080 is also listen.http"),
        (
            'internal_l4 = "10.0.0.1:9000"\nmgmt = "0.0.0.0:9000"',
            "listen.mgmt: 0.0.0.0:9000 overlaps listen.internal_l4",
        ),
    ],
)
def test_two_listeners_on_one_address_are_refused(listen, error):
    with pytest.raises(ConfigError) as exc:
        load_bytes(f'[listen]\nhttps = "0.0.0.0:8443"\n{listen}\n'.encode())
    assert str(exc.value).startswith(error), exc.value
    assert str(exc.value).endswith(": each listener needs its own address")


@pytest.mark.parametrize(
    "listen",
    [
        'http = "0.0.0.0:8080"\nmgmt = "127.0.0.1:9180"',
        'http = "127.0.0.2:8443"',  # https on one address, http on another, same port: two listeners
        'mgmt = "127.0.0.1:0"',  # port 0: a new port each time
    ],
)
def test_listeners_on_distinct_addresses_pass(listen):
    https = "127.0.0.1:8443" if "127.0.0.2" in listen else "0.0.0.0:8443"
    load_bytes(f'[listen]\nhttps = "{https}"\n{listen}\n'.encode())


def test_http2_limits_are_keys_with_the_issue_17_defaults():
    h2 = load_bytes(b"").http2
    assert (h2.max_concurrent_streams, h2.max_streams_per_connection) == (100, 1000)
    assert (h2.initial_stream_window, h2.connection_window) == (65536, 1 << 20)
    assert (h2.max_frame_size, h2.header_table_size, h2.max_queued_acks) == (16384, 4096, 1000)
    assert (h2.premature_reset_min_streams, h2.premature_reset_window_s) == (100, 1.0)
    assert load_bytes(b"").limits.send_timeout_s == 60  # nginx's send_timeout
    edge = load_bytes(
        b"[http2]\nmax_concurrent_streams = 1\nmax_streams_per_connection = 1\ninitial_stream_window = 2147483647\n"
        b"connection_window = 2147483647\nmax_frame_size = 16777215\nheader_table_size = 0\n"
    ).http2
    assert edge.max_frame_size == (1 << 24) - 1 and edge.connection_window == (1 << 31) - 1


@pytest.mark.parametrize(
    "body, key",
    [
        (b"max_concurrent_streams = 0", "http2.max_concurrent_streams"),
        (b"max_concurrent_streams = 10001", "http2.max_concurrent_streams"),
        (b'max_concurrent_streams = "100"', "http2.max_concurrent_streams"),
        (b"max_streams_per_connection = 0", "http2.max_streams_per_connection"),
        (b"max_streams_per_connection = 1073741825", "http2.max_streams_per_connection"),
        (b"max_streams_per_connection = 50", "http2.max_streams_per_connection"),  # below the concurrency cap
        (b"initial_stream_window = 1023", "http2.initial_stream_window"),
        (b"initial_stream_window = 2147483648", "http2.initial_stream_window"),  # RFC 9113 §6.9.1
        (b"connection_window = 65534", "http2.connection_window"),
        (b"connection_window = 2147483648", "http2.connection_window"),
        (b"initial_stream_window = 2097152", "http2.connection_window"),  # a stream window above the connection's
        (b"max_frame_size = 16383", "http2.max_frame_size"),  # RFC 9113 §6.5.2
        (b"max_frame_size = 16777216", "http2.max_frame_size"),
        (b"header_table_size = -1", "http2.header_table_size"),
        (b"header_table_size = 65537", "http2.header_table_size"),
        (b"max_queued_acks = 15", "http2.max_queued_acks"),
        (b"max_queued_acks = 100001", "http2.max_queued_acks"),
        (b"premature_reset_min_streams = 0", "http2.premature_reset_min_streams"),
        (b"premature_reset_window_s = 0", "http2.premature_reset_window_s"),
        (b"premature_reset_window_s = 61", "http2.premature_reset_window_s"),
    ],
)
def test_a_bad_http2_limit_names_its_key(body, key):
    with pytest.raises(ConfigError) as err:
        load_bytes(b"[http2]\n" + body + b"\n")
    assert str(err.value).startswith(key + ":"), str(err.value)


@pytest.mark.parametrize("value", [b"0", b"-1", b'"60s"'])
def test_a_bad_send_timeout_names_its_key(value):
    with pytest.raises(ConfigError) as err:
        load_bytes(b"[limits]\nsend_timeout_s = " + value + b"\n")
    assert str(err.value).startswith("limits.send_timeout_s:"), str(err.value)


def test_a_bad_http2_limit_exits_2_before_binding(tmp_path):
    port = free_port()
    conf = tmp_path / "bad.toml"
    conf.write_text(f'[listen]\nhttps = "127.0.0.1:{port}"\n[http2]\nmax_frame_size = 1024\n')
    proc = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "run", "--config", str(conf)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )
    assert proc.returncode == 2, proc.stderr
    assert "http2.max_frame_size: must be within 16384..16777215, got 1024" in proc.stderr
    import socket

    with socket.socket() as s:  # nothing bound the port
        s.bind(("127.0.0.1", port))
