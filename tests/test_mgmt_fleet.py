"""The management API against a running fleet: the token matrix, health, backends, mappings, the process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests import mgmt_client as mc
from tests.peers import REPO, wait_until

BODY = """
[[instances]]
service = "web"
id = "web-1"
host = "127.0.0.1"
port = {port}
[[instances]]
service = "web"
id = "web-2"
host = "127.0.0.1"
port = 9
state = "Draining"
[[domains]]
hostname = "shop.apps.test"
service = "web"
env_id = "env-1"
app_id = "app-1"
[[domains]]
hostname = "*.wild.test"
service = "web"
"""


@pytest.fixture
def fleet(fleet_factory, web):
    return fleet_factory(BODY.format(port=web.port), mgmt=True)


def mgmt_pid(fleet) -> int | None:
    pids = [pid for pid, title in fleet.children().items() if title.endswith(": mgmt")]
    return pids[0] if pids else None


def test_token_matrix(fleet):
    url, secret = fleet.mgmt_url, fleet.secret
    wait_until(lambda: mc.call(url, "GET", "/health")[0] == 200, 10, what="mgmt up")
    now = int(time.time())
    refused = {
        "expired": mc.token(secret, exp=now - 120, iat=now - 600),
        "nbf in the future": mc.token(secret, nbf=now + 600),
        "wrong aud": mc.token(secret, aud="someone-else"),
        "wrong iss": mc.token(secret, iss="evil-auth"),
        "no jti": mc.token(secret, jti=None),
        "no exp": mc.token(secret, exp=None),
        "no sub": mc.token(secret, sub=None),
        "no iat": mc.token(secret, iat=None),
        "no aud": mc.token(secret, aud=None),
        "no iss": mc.token(secret, iss=None),
        "HS512 right secret": mc.token(secret, alg="HS512"),
        "HS384 right secret": mc.token(secret, alg="HS384"),
        "wrong signature": mc.token("x" * 40),
        "garbage": "not.a.token",
    }
    import jwt as pyjwt

    refused["alg none"] = pyjwt.encode(mc.claims(), None, algorithm="none")
    for what, tok in refused.items():
        status, headers, _ = mc.call(url, "GET", "/backends", tok)
        assert status == 401, what
        assert headers.get("www-authenticate", "").startswith("Bearer"), what
    # no token at all, and a valid token in the query string
    status, headers, _ = mc.call(url, "GET", "/backends")
    assert status == 401 and headers["www-authenticate"].startswith("Bearer")
    good = mc.token(secret)
    assert mc.call(url, "GET", f"/backends?access_token={good}")[0] == 401
    assert mc.call(url, "GET", f"/mappings?q={good}", good)[0] == 401  # even beside a valid header
    # valid without the scope -> 403; valid with it -> 200 (and reads may reuse the token)
    reader = mc.token(secret, scope="proxy:mappings:read")
    assert mc.call(url, "GET", "/backends", reader)[0] == 403
    assert mc.call(url, "GET", "/policy", reader)[0] == 403
    assert mc.call(url, "GET", "/mappings", reader)[0] == 200
    assert mc.call(url, "GET", "/mappings", reader)[0] == 200
    # a jti is one-use on a change: the replay gets 401
    admin = mc.token(secret, scope="policy-admin")
    assert mc.call(url, "PUT", "/policy", admin, {"waf": True})[0] == 200
    status, headers, _ = mc.call(url, "PUT", "/policy", admin, {"waf": False})
    assert status == 401 and "invalid_token" in headers["www-authenticate"]
    assert mc.call(url, "GET", "/policy", admin)[0] == 200  # a read may reuse it
    # every refusal was counted by reason, and no token text reached the log
    status, stats = mc.get_json(url, "/stats", mc.token(secret, scope="proxy:stats:read"))
    refusals = stats["auth_refusals"]
    for reason in ("expired", "not_yet_valid", "bad_audience", "bad_issuer", "missing_claim", "bad_algorithm",
                   "bad_signature", "token_in_query", "missing", "scope", "replay"):
        assert refusals.get(reason, 0) >= 1, (reason, refusals)
    assert good not in fleet.output() and good.split(".")[2] not in fleet.output()
    # each refusal's event line comes through the output pipe after its answer: waited for, not raced
    wait_until(lambda: len(fleet.events("mgmt_auth_refused")) >= sum(refusals.values()), 5, what="every refusal's line")
    assert len(fleet.events("mgmt_auth_refused")) == sum(refusals.values())
    # counted in shared memory: a respawned mgmt process still reports them
    os.kill(mgmt_pid(fleet), signal.SIGKILL)
    wait_until(lambda: mc.call(url, "GET", "/health")[0] == 200, 10, what="mgmt back")
    _, again = mc.get_json(url, "/stats", mc.token(secret, scope="proxy:stats:read"))
    assert again["auth_refusals"] == refusals


def test_health_backends_and_mappings(fleet, web):
    url = fleet.mgmt_url
    status, health = wait_until(lambda: (r := mc.get_json(url, "/health"))[0] == 200 and r, 10, what="health")
    assert health["status"] == "ok" and health["stale"] is False
    assert health["mappings"] == 2 and health["services"] == 1
    assert health["instances"] == {"Active": 1, "Draining": 1}
    assert health["workers"] == 2 and health["active_connections"] == 0
    assert health["snapshot_age_s"] is not None and health["snapshot_age_s"] >= 0
    assert health["tls"]["certificates_rejected"] == 0  # the TLS edge's part (issue 13)
    tok = mc.token(fleet.secret)
    status, backends = mc.get_json(url, "/backends", tok)
    rows = {r["id"]: r for r in backends["services"]["web"]}
    assert rows["web-1"] == {"id": "web-1", "host": "127.0.0.1", "port": web.port, "state": "Active",
                             "health_age_s": None, "fresh": True, "suspect": None, "tls": False,
                             "proxy_protocol": ""}
    assert rows["web-2"]["fresh"] is False
    status, maps = mc.get_json(url, "/mappings", tok)
    assert maps["total"] == 2
    assert maps["mappings"][0] == {"hostname": "*.wild.test", "service": "web", "env_id": "", "app_id": "",
                                   "source": "file", "wildcard": True}
    status, maps = mc.get_json(url, "/mappings?host=SHOP", tok)
    assert [m["hostname"] for m in maps["mappings"]] == ["shop.apps.test"]
    assert maps["mappings"][0]["env_id"] == "env-1" and maps["mappings"][0]["wildcard"] is False
    assert mc.get_json(url, "/mappings?service=nope", tok)[1]["total"] == 0
    status, body = mc.get_json(url, "/mappings?limit=0", tok)
    assert status == 422 and body["field"] == "limit"
    status, _, metrics = mc.call(url, "GET", "/metrics")
    assert status == 200 and b"sentin8_active_connections" in metrics
    status, doc = mc.get_json(url, "/openapi.json")
    assert set(doc["paths"]) >= {"/health", "/backends", "/mappings", "/policy", "/metrics", "/stats"}
    status, headers, page = mc.call(url, "GET", "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert b"<script" in page and b"http://" not in page and b"https://" not in page  # nothing from a CDN


def test_bad_policy_input_gets_422_naming_the_field(fleet):
    url = fleet.mgmt_url
    wait_until(lambda: mc.call(url, "GET", "/health")[0] == 200, 10, what="mgmt up")
    cases = [
        ({"rate_limit_rps": -1}, "rate_limit_rps"),
        ({"rate_limit_burst": "lots"}, "rate_limit_burst"),
        ({"waf": "yes"}, "waf"),
        ({"rate_limit_key": "cookie"}, "rate_limit_key"),
        ({"max_headers": 5}, "max_headers"),
        ({}, "body"),
        ([1, 2], "body"),
    ]
    for body, field in cases:
        status, _, raw = mc.call(url, "PUT", "/policy", mc.token(fleet.secret, scope="policy-admin"), body)
        assert status == 422, body
        assert json.loads(raw)["field"] == field
    status, _, raw = mc.call(url, "PUT", "/policy", mc.token(fleet.secret, scope="policy-admin"),
                             {"waf": True, "pad": "x" * 20_000})
    assert status == 413 and json.loads(raw)["field"] == "body"
    status, view = mc.get_json(url, "/policy", mc.token(fleet.secret, scope="policy-admin"))
    assert view["overlay"] == {} and view["effective"]["waf"] is False


def test_mgmt_process_is_respawned_serves_again_within_a_second_and_remembers_jtis(fleet):
    url = fleet.mgmt_url
    wait_until(lambda: mc.call(url, "GET", "/health")[0] == 200, 10, what="mgmt up")
    old = mgmt_pid(fleet)
    assert old is not None
    admin = mc.token(fleet.secret, scope="policy-admin")
    assert mc.call(url, "PUT", "/policy", admin, {"waf": True})[0] == 200
    os.kill(old, signal.SIGKILL)
    t0 = time.monotonic()
    # the supervisor keeps the listening socket: a request sent now waits in the accept queue, not refused
    status, _ = mc.get_json(url, "/health")
    back = time.monotonic() - t0
    assert status == 200
    assert back < 1.0, f"mgmt back after {back:.2f}s"
    new = mgmt_pid(fleet)
    assert new is not None and new != old
    assert mc.call(url, "PUT", "/policy", admin, {"waf": False})[0] == 401  # used jti values live in shm


def _boot(tmp_path, secret: str | None, mgmt: str = "127.0.0.1:0") -> subprocess.CompletedProcess:
    cfg = tmp_path / "p.toml"
    cfg.write_text(f'[listen]\nhttps = "127.0.0.1:0"\nhttp = ""\nmgmt = "{mgmt}"\n'
                   f'[tls]\nstate_dir = "{tmp_path}/state"\ncert_dir = "{tmp_path}/certs"\n')
    env = {k: v for k, v in os.environ.items() if k != "SENTIN8_MGMT_JWT_SECRET"}
    if secret is not None:
        env["SENTIN8_MGMT_JWT_SECRET"] = secret
    return subprocess.run([sys.executable, "-m", "supervisor.cli", "run", "--config", str(cfg)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("secret", [None, "x" * 31])
def test_boot_refuses_a_missing_or_short_secret(tmp_path, secret):
    done = _boot(tmp_path, secret)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and re.match(r"sentin8-proxy: mgmt\.jwt_secret_env: ", lines[0]), done.stderr
    assert "x" * 31 not in done.stderr  # the secret itself is never printed


def test_a_taken_mgmt_port_exits_2(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _boot(tmp_path, "s" * 40, f"127.0.0.1:{port}")
    assert done.returncode == 2
    assert done.stderr.strip().startswith("sentin8-proxy: listen.mgmt: cannot listen on")


def test_cli_against_the_running_fleet(fleet):
    wait_until(lambda: mc.call(fleet.mgmt_url, "GET", "/health")[0] == 200, 10, what="mgmt up")
    env = {k: v for k, v in os.environ.items() if k not in ("SENTIN8_MGMT_TOKEN", "SENTIN8_MGMT_JWT_SECRET")}

    def cli(*args: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "supervisor.cli", *args, "--config", fleet.config,
                               "--url", fleet.mgmt_url], cwd=REPO,
                              env={**env, **extra}, capture_output=True, text=True, timeout=30)

    done = cli("status")
    assert done.returncode == 0 and done.stdout.startswith("ok "), done.stderr
    done = cli("backends")
    assert done.returncode == 1 and "SENTIN8_MGMT_TOKEN" in done.stderr  # no token, no secret: told what to do
    tok = mc.token(fleet.secret)
    done = cli("backends", SENTIN8_MGMT_TOKEN=tok)
    assert done.returncode == 0 and "web-1" in done.stdout and "offload" in done.stdout
    done = cli("mappings", "--host", "shop", SENTIN8_MGMT_TOKEN=tok)
    assert done.returncode == 0 and "shop.apps.test" in done.stdout and "wild" not in done.stdout
    # on the box with the secret: each change mints its own one-use token
    done = cli("policy", "--set", "waf=true", "rate_limit_rps=5", SENTIN8_MGMT_JWT_SECRET=fleet.secret)
    assert done.returncode == 0, done.stderr
    done = cli("policy", "--set", "rate_limit_key=ip+host", SENTIN8_MGMT_JWT_SECRET=fleet.secret)
    assert done.returncode == 0, done.stderr
    _, view = mc.get_json(fleet.mgmt_url, "/policy", tok)
    assert view["overlay"] == {"waf": True, "rate_limit_rps": 5.0, "rate_limit_key": "ip+host"}
    done = cli("policy", "--set", "rate_limit_rps=-1", SENTIN8_MGMT_JWT_SECRET=fleet.secret)
    assert done.returncode == 1 and "rate_limit_rps" in done.stderr
    done = cli("token", "--scope", "proxy:stats:read", "--ttl", "60", SENTIN8_MGMT_JWT_SECRET=fleet.secret)
    assert done.returncode == 0
    assert mc.call(fleet.mgmt_url, "GET", "/stats", done.stdout.strip())[0] == 200
    assert mc.call(fleet.mgmt_url, "GET", "/backends", done.stdout.strip())[0] == 403


def test_schemathesis_finds_no_server_error(fleet, tmp_path):
    """Every check, not only server errors: status codes, content types and bodies must match /openapi.json."""
    wait_until(lambda: mc.call(fleet.mgmt_url, "GET", "/health")[0] == 200, 10, what="mgmt up")
    env = {**os.environ, "SENTIN8_MGMT_JWT_SECRET": fleet.secret, "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks",
           "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    done = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "schemathesis"), "run", f"{fleet.mgmt_url}/openapi.json",
         "--checks", "all", "--max-examples", "40", "--workers", "1", "--seed", "10",
         "--phases", "examples,coverage,fuzzing", "--request-timeout", "10", "--no-color"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    print(done.stdout[-3000:])
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "No issues found" in done.stdout and " 0 generated" not in done.stdout
    assert fleet.events("policy_changed")  # the hook's fresh tokens let valid changes through, not only 401s
    assert fleet.proc.poll() is None and not fleet.events("child_died")  # nothing crashed


def test_mappings_endpoint_at_100k_hostnames(fleet_factory, web):
    names = 100_000
    body = BODY.format(port=web.port) + "".join(
        f'[[domains]]\nhostname = "app{i}.env{i % 97}.apps.test"\nservice = "web"\n' for i in range(names))
    fleet = fleet_factory(body, mgmt=True)
    url, tok = fleet.mgmt_url, mc.token(fleet.secret, scope="proxy:mappings:read")
    wait_until(lambda: mc.get_json(url, "/health")[1].get("mappings") == names + 2, 30, 0.2, what="100k published")
    t0 = time.monotonic()
    status, first = mc.get_json(url, "/mappings", tok)
    cold = time.monotonic() - t0
    timings = []
    for query in ("/mappings?offset=90000&limit=1000", "/mappings?host=app99999.", "/mappings?service=web&limit=10"):
        t0 = time.monotonic()
        status, page = mc.get_json(url, query, tok)
        timings.append(time.monotonic() - t0)
        assert status == 200
    print(f"/mappings at 100k: first call (decode + index) {cold * 1000:.0f} ms, then"
          f" {', '.join(f'{t * 1000:.0f}' for t in timings)} ms")
    assert first["total"] == names + 2 and len(first["mappings"]) == 1000
    assert page["total"] == names + 2 and len(page["mappings"]) == 10
    assert max(timings) < 1.0 and cold < 3.0  # generous: a shared 2-core box


def test_reload_restarts_mgmt_with_the_new_config(fleet):
    url = fleet.mgmt_url
    wait_until(lambda: mc.call(url, "GET", "/health")[0] == 200, 10, what="mgmt up")
    old = mgmt_pid(fleet)
    with open(fleet.config, "a") as fh:
        fh.write("\n[policy]\nwaf = true\n")
    fleet.signal(signal.SIGHUP)
    admin = mc.token(fleet.secret, scope="policy-admin")
    wait_until(lambda: mc.get_json(url, "/policy", admin)[1]["config"]["waf"] is True, 15, 0.1,
               what="mgmt on the new config")
    assert mgmt_pid(fleet) not in (None, old)
    assert not [e for e in fleet.events("child_died") if e.get("child") == "mgmt"]  # a planned restart


def test_upgrade_beside_a_running_fleet_takes_the_mgmt_port_over(tmp_path, fleet_factory, web):
    from tests.peers import Fleet

    old = fleet_factory(BODY.format(port=web.port), mgmt=True)
    wait_until(lambda: mc.call(old.mgmt_url, "GET", "/health")[0] == 200, 10, what="old mgmt up")
    newdir = tmp_path / "new"
    newdir.mkdir()
    new = Fleet(str(newdir), BODY.format(port=web.port), 2, port=old.port, mgmt=old.mgmt_port,
                args=("--beside-running-fleet",))
    try:
        assert new.saw("mgmt_deferred") and new.mgmt_url == old.mgmt_url
        old.signal(signal.SIGTERM)
        assert old.proc.wait(30) == 0
        wait_until(lambda: new.saw("mgmt_listening"), 5, 0.1, what="the new fleet took the mgmt port")
        status, _, _ = mc.call(new.mgmt_url, "GET", "/backends", mc.token(new.secret))
        assert status == 200  # the new fleet's own secret: it is the one answering
    finally:
        new.stop()


def test_requests_racing_mgmt_restarts_all_get_answers(fleet):
    """A reload restarts the management process; requests that race its exit, on fresh connections or on a
    keep-alive one, are all answered (by the old process, with Connection: close, or the new one), none reset."""
    import http.client
    import threading
    from urllib.parse import urlsplit

    url = fleet.mgmt_url
    wait_until(lambda: mc.call(url, "GET", "/health")[0] == 200, 10, what="mgmt up")
    host, port = urlsplit(url).hostname, urlsplit(url).port
    stop = threading.Event()
    answered: list[int] = []
    errors: list[str] = []

    def fresh_connections() -> None:
        while not stop.is_set():
            try:
                answered.append(mc.call(url, "GET", "/health")[0])
            except Exception as exc:
                errors.append(f"fresh: {exc!r}")

    def keep_alive() -> None:
        conn = http.client.HTTPConnection(host, port, timeout=5)
        while not stop.is_set():
            try:
                conn.request("GET", "/health")
                resp = conn.getresponse()
                resp.read()
                answered.append(resp.status)
                if resp.will_close:  # the old process said Connection: close: the next request opens anew
                    conn.close()
            except Exception as exc:
                errors.append(f"keep-alive: {exc!r}")
                conn.close()

    threads = [threading.Thread(target=fresh_connections), threading.Thread(target=keep_alive)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(4):
            old = mgmt_pid(fleet)
            seen = len(fleet.events("reload_done"))
            fleet.signal(signal.SIGHUP)
            wait_until(lambda seen=seen: len(fleet.events("reload_done")) > seen, 20, 0.05, what="reload done")
            wait_until(lambda old=old: mgmt_pid(fleet) not in (None, old), 10, 0.05, what="a new mgmt process")
            start = len(answered)
            wait_until(lambda start=start: len(answered) > start + 5, 10, 0.02, what="the new mgmt answering")
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    assert not errors, errors[:5]
    assert answered and set(answered) == {200}
