"""Cluster mode's limiter through two whole fleets (issue 19 §1): two supervisors with their own shared memory
(two hosts), one Valkey, external PQ TLS clients from a network namespace.

R is small and the runs a few seconds: the admitted count is checked from the second second on, when the
first burst is spent, against R ± 10% (a control run with cluster mode off admits ~2R).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.netns import external_host  # noqa: F401 - fixture
from tests.peers import Fleet, wait_until
from tests.pqclient import PQClient

pytestmark = pytest.mark.netns

R, B = 20, 5
GET = b"GET /x HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n"


def _fleet(tmp_path: Path, name: str, web, valkey_url: str | None, secret: str, fallback: str = "per_host") -> Fleet:
    workdir = tmp_path / name
    workdir.mkdir(exist_ok=True)
    cluster = (
        f'[cluster]\nenabled = true\nvalkey_url = "{valkey_url}"\nnode_id = "{name}"\nfallback = "{fallback}"\n'
        if valkey_url
        else ""
    )
    body = f"""
[policy]
rate_limit = true
rate_limit_rps = {R}
rate_limit_burst = {B}
{cluster}
[[instances]]
service = "web"
id = "web-1"
host = "127.0.0.1"
port = {web.port}
[[domains]]
hostname = "shop.apps.test"
service = "web"
"""
    return Fleet(str(workdir), body, workers=1, host="0.0.0.0", mgmt=True, env={"SENTIN8_CLUSTER_SECRET": secret})


def health(fleet: Fleet) -> dict:
    with urllib.request.urlopen(fleet.mgmt_url + "/health", timeout=5) as resp:
        return json.loads(resp.read())


def metrics(fleet: Fleet) -> dict[str, float]:
    with urllib.request.urlopen(fleet.mgmt_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("sentin8_cluster_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


@pytest.fixture
def hosts(tmp_path, web, redis_server, request):
    """Two fleets; ``request.param``: the ``cluster.fallback`` (default "per_host"), or False = the control,
    cluster mode off."""
    param = getattr(request, "param", "per_host")
    clustered = param is not False
    secret = secrets.token_urlsafe(36)
    url = redis_server.url if clustered else None
    made = []
    try:
        for name in ("a", "b"):
            made.append(_fleet(tmp_path, name, web, url, secret, param or "per_host"))
        if clustered:
            for f in made:
                wait_until(lambda f=f: health(f)["cluster"]["hosts_seen"] == 2, 10, what="both hosts seen")
                assert health(f)["cluster"]["limiter"] == "global"
        yield made
    finally:
        for f in made:
            f.stop()


class Client:
    """Keep-alive PQ connections from the external host: ``THREADS`` threads, each with one connection per fleet,
    requests paced at ``rate`` in all and spread round-robin; each (time since start, status, seconds it took)
    recorded. Threads, so that a loaded machine's slower round trips still add up to the rate asked for."""

    THREADS = 4

    def __init__(self, ext, fleets: list[Fleet]) -> None:
        self.conns: list[list[PQClient]] = []
        for _ in range(self.THREADS):
            row = []
            for f in fleets:
                c = PQClient(ext.connect(f.port), "shop.apps.test")
                c.handshake()
                row.append(c)
            self.conns.append(row)
        self.log: list[tuple[float, int, float]] = []
        self.host_of: list[int] = []  # beside each log entry: the index of the fleet that answered
        self.lock = threading.Lock()
        self.start = time.monotonic()

    def _thread(self, i: int, rate: float, begin: float, end: float, errors: list) -> None:
        n = 0
        period = self.THREADS / rate
        try:
            while True:
                due = begin + (n + i / self.THREADS) * period
                if due >= end:
                    return
                time.sleep(max(0.0, due - time.monotonic()))
                host = n % len(self.conns[i])
                c = self.conns[i][host]
                t0 = time.monotonic()
                resp = c.request(GET)
                took = time.monotonic() - t0
                with self.lock:
                    self.log.append((t0 - self.start, int(resp.split(b" ", 2)[1]), took))
                    self.host_of.append(host)
                n += 1
        except Exception as exc:  # the test fails on it
            errors.append(exc)

    def run(self, rate: float, seconds: float, on_tick=None) -> None:
        begin = time.monotonic()
        end = begin + seconds
        errors: list = []
        threads = [
            threading.Thread(target=self._thread, args=(i, rate, begin, end, errors), daemon=True)
            for i in range(self.THREADS)
        ]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            if on_tick is not None:
                on_tick(time.monotonic() - self.start)
            time.sleep(0.05)
        assert not errors, errors

    def admitted(self, since: float, until: float, host: int | None = None) -> int:
        """200s sent within [since, until) (by the fleet of index ``host`` only, if given)."""
        return sum(
            1
            for (t, status, _), h in zip(self.log, self.host_of, strict=True)
            if since <= t < until and status == 200 and host in (None, h)
        )

    def sent(self, since: float, until: float) -> int:
        return sum(1 for t, _, _ in self.log if since <= t < until)

    def now(self) -> float:
        return time.monotonic() - self.start

    def close(self) -> None:
        for row in self.conns:
            for c in row:
                c.close()


@pytest.mark.parametrize("spread", [2, 1], ids=["spread", "pinned"])
def test_4r_over_two_hosts_is_admitted_at_r(external_host, hosts, spread):  # noqa: F811
    client = Client(external_host, hosts[:spread])
    client.run(4 * R, 4.0)
    client.close()
    assert {status for _, status, _ in client.log} <= {200, 429}
    assert client.sent(1.0, 4.0) >= 0.8 * 3 * 4 * R  # the client did send ~4R
    got = client.admitted(1.0, 4.0)
    print(f"{'spread' if spread == 2 else 'pinned'}: {got} admitted in seconds 1-4, R*3 = {3 * R}")
    assert 0.9 * 3 * R <= got <= 1.1 * 3 * R, (got, 3 * R)
    m = metrics(hosts[0])
    assert m["sentin8_cluster_limiter_global"] == 1 and m["sentin8_cluster_hosts_seen"] == 2
    assert m["sentin8_cluster_sync_errors_total"] == 0 and m["sentin8_cluster_sync_batch_keys_max"] <= 512


@pytest.mark.parametrize("hosts", [False], indirect=True, ids=["cluster-off"])
def test_control_without_cluster_mode_two_hosts_admit_2r(external_host, hosts):  # noqa: F811
    client = Client(external_host, hosts)
    client.run(4 * R, 3.0)
    client.close()
    got = client.admitted(1.0, 3.0)
    sent = client.sent(1.0, 3.0)
    print(f"cluster off: {got} admitted in seconds 1-3 ({sent} sent), 2R * 2 s = {4 * R}")
    assert got >= 0.9 * 2 * 2 * R, (got, sent, 4 * R)  # each host's own bucket: 2R together
    assert health(hosts[0])["cluster"] == {
        "enabled": False,
        "limiter": "local",
        "ticket_keys": "local",
        "hosts_seen": 1,
    }


@pytest.mark.parametrize("hosts", ["per_host", "share"], indirect=True)
def test_valkey_killed_under_load_falls_back_then_is_global_again_without_a_storm(
    external_host,  # noqa: F811
    hosts,
    redis_server,
    request,
):
    """4R spread over both hosts, Valkey SIGKILLed: each host limits alone, with the whole limit (``per_host``:
    2R admitted in all) or its share of the hosts last seen (``share``: R / 2 each, R in all); Valkey back:
    global again within 3 s and admissions go on at ~R, no storm of 429s from the outage's debt."""
    fallback = request.node.callspec.params["hosts"]
    client = Client(external_host, hosts)
    client.run(4 * R, 1.5)
    redis_server.stop(kill=True)
    killed = client.now()
    client.run(4 * R, 1.0)
    for f in hosts:
        assert health(f)["cluster"]["limiter"] == "local-fallback"
        assert health(f)["cluster"]["hosts_seen"] == 2  # the hosts last seen: what "share" divides by
    client.run(4 * R, 2.0)
    during = [client.admitted(killed + 1.0, killed + 3.0, host=i) / 2.0 for i in range(2)]  # per second, per host
    redis_server.start()
    back = [None]

    def watch(now: float) -> None:
        if back[0] is None and all(health(f)["cluster"]["limiter"] == "global" for f in hosts):
            back[0] = now

    restarted = client.now()
    client.run(4 * R, 4.0, on_tick=watch)
    client.close()
    assert back[0] is not None and back[0] - restarted < 3.0, back
    assert {status for _, status, _ in client.log} <= {200, 429}
    assert max(took for _, _, took in client.log) < 1.0  # no request waited on Valkey
    per_host = R if fallback == "per_host" else R / 2  # R / hosts_seen
    for got in during:  # each host enforces its limit alone: its refill, plus at most its burst over 2 s
        assert 0.8 * per_host <= got <= 1.2 * per_host + B / 2, (fallback, during)
    # no 429 storm: right after the limiter is global again, admissions go on at ~R
    after = client.admitted(back[0], back[0] + 2.0)
    print(
        f"outage ({fallback}): {during} admitted per host per second in fallback (limit {per_host}), global again"
        f" {back[0] - restarted:.2f} s after the restart, {after} admitted in the 2 s after, max latency"
        f" {max(took for _, _, took in client.log):.3f} s"
    )
    assert 0.8 * 2 * R <= after <= 1.2 * 2 * R + B, after
    m = metrics(hosts[0])
    assert m["sentin8_cluster_fallback_seconds_total"] > 1.0 and m["sentin8_cluster_sync_errors_total"] >= 1
