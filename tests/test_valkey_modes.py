"""``sources.valkey_mode`` = "cluster" and "sentinel" against real deployments (tests/topologies.py): the config
checks, the registry and its events through a fleet, ``stat:metrics``, the limiter's script and the policy
document in a 3-master cluster, and a Sentinel failover under load with no failed request."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time

import pytest
import redis

from sentin8 import valkey_client
from sentin8.cluster import limiter_script, policy_doc
from sentin8.config import ConfigError, load_bytes
from sentin8.sources.registry import CHANGED_CHANNEL as REGISTRY_CHANNEL
from sentin8.sources.registry import fetch_registry
from supervisor.cluster_sync import LimitSyncer
from tests.peers import roundtrip, wait_until
from tests.test_cluster_limiter import _drive, status, tracked_table
from tests.topologies import SentinelGroup, ValkeyCluster, sentinel_group, valkey_cluster, valkey_group  # noqa: F401 - fixtures

HOST = "shop.apps.test"
DOMAINS = f'[[domains]]\nhostname = "{HOST}"\nservice = "web"\n'


# ---- config ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ('valkey_mode = "cluster"', "sources.valkey_mode: "),
        ('valkey_mode = "sentinel"\nvalkey_nodes = ["10.0.0.1:26379"]', "sources.valkey_mode: "),
        ('valkey_mode = "cluster"\nvalkey_nodes = ["10.0.0.1"]', "sources.valkey_nodes[0]: "),
        ('valkey_mode = "cluster"\nvalkey_nodes = ["a:1", "b:70000"]', "sources.valkey_nodes[1]: "),
        ('valkey_mode = "cluster"\nvalkey_nodes = ["a:1"]\nvalkey_url = "redis://x/3"', "sources.valkey_mode: "),
        ('valkey_mode = "ring"', "sources.valkey_mode"),
    ],
)
def test_bad_mode_settings_name_the_key(body: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error.replace("[", r"\[").replace("]", r"\]")):
        load_bytes(f"[sources]\n{body}\n".encode())


def test_targets_follow_the_sources_unless_a_section_has_its_own_url() -> None:
    cfg = load_bytes(
        b'[sources]\nregistry = "valkey"\nvalkey_mode = "sentinel"\nvalkey_nodes = ["[::1]:26379", "s2:26379"]\n'
        b'sentinel_master = "m"\n[cluster]\nvalkey_url = "redis://10.0.0.5:6379/0"\n'
    )
    assert cfg.sources_valkey().mode == "sentinel" and cfg.sources_valkey().nodes == ("[::1]:26379", "s2:26379")
    assert cfg.metrics_valkey() == cfg.sources_valkey()  # stat:metrics defaults to the registry's Valkey, mode too
    assert cfg.cluster_valkey().mode == "single" and cfg.cluster_valkey().url == "redis://10.0.0.5:6379/0"
    assert valkey_client.split_node("[::1]:26379") == ("::1", 26379)
    assert load_bytes(b"").metrics_valkey() is None  # file sources: nothing published


# ---- through a fleet ------------------------------------------------------------------------------------------


def _sources(group: ValkeyCluster | SentinelGroup, metrics_channel: str = "stat:metrics") -> str:
    # Events (1 s debounce), not the polls, must carry the change: both polls are far away.
    return f"""
[sources]
registry = "valkey"
{group.sources()}
poll_interval_s = 3600
health_fresh_s = 120
health_refresh_s = 60
boot_retries = 20
boot_retry_interval_s = 0.25
[metrics]
channel = "{metrics_channel}"
interval_s = 0.5
"""


def _put(client, iid: str, port: int, publish: bool = True) -> None:
    value = {"host": "127.0.0.1", "port": port, "state": "Active", "health_ts": time.time(), "tls": True}
    client.hset("captain:svc:web", iid, json.dumps(value))
    if publish:
        client.publish(REGISTRY_CHANNEL, "web")


def _answer(port: int) -> bytes:
    try:
        return roundtrip(port, HOST)
    except (ssl.SSLError, OSError):
        return b""


def test_registry_events_and_metrics_work_through_a_fleet(valkey_group, backend_factory, fleet_factory):  # noqa: F811
    a, b = backend_factory("a", HOST), backend_factory("b", HOST)
    client = valkey_group.client()
    _put(client, "web-1", a.port, publish=False)
    sub = client.pubsub(ignore_subscribe_messages=True)
    sub.subscribe("stat:metrics")
    fleet = fleet_factory(DOMAINS, extra=_sources(valkey_group))
    wait_until(lambda: _answer(fleet.port) == b"a:ping", 10, what="the registry's instance routed")

    client.hdel("captain:svc:web", "web-1")
    _put(client, "web-2", b.port)  # + captain:changed
    t0 = time.monotonic()
    wait_until(lambda: _answer(fleet.port) == b"b:ping", 5, what="the change routed after its event")
    print(f"{valkey_group.mode}: captain:changed -> routed in {time.monotonic() - t0:.2f} s")

    msg = wait_until(lambda: sub.get_message(timeout=0.2), 10, what="a stat:metrics document")
    doc = json.loads(msg["data"])
    assert doc["seq"] >= 1 and doc["host"]
    stats = fleet.stats()
    assert stats.get("backend_connect_errors", 0) == 0


def test_a_sentinel_failover_under_load_fails_no_request(sentinel_group, backend_factory, fleet_factory):  # noqa: F811
    a, b = backend_factory("a", HOST), backend_factory("b", HOST)
    client = sentinel_group.client()
    _put(client, "web-1", a.port, publish=False)
    fleet = fleet_factory(DOMAINS, extra=_sources(sentinel_group))
    wait_until(lambda: _answer(fleet.port) == b"a:ping", 10, what="routed before the failover")

    answers: list[bytes] = []
    stop = threading.Event()

    def load() -> None:  # light load: one connection at a time, back to back
        while not stop.is_set():
            answers.append(_answer(fleet.port))

    threads = [threading.Thread(target=load, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        old = sentinel_group.master_address()[1]
        new = sentinel_group.failover()
        assert new != old
        # A registry change written to the new master routes (the old connections are found out and replaced).
        client = sentinel_group.client()
        wait_until(lambda: _writable(client), 15, 0.1, what="the new master takes writes")
        client.hdel("captain:svc:web", "web-1")
        _put(client, "web-2", b.port)
        wait_until(lambda: b"b:ping" in answers[-5:], 15, what="the post-failover change routed")
        wait_until(lambda: len(answers) > 50, 10, what="some load")
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    failed = [x for x in answers if x not in (b"a:ping", b"b:ping")]
    print(f"failover: {len(answers)} requests, {len(failed)} failed; old master {old}, new {new}")
    assert not failed


def _writable(client) -> bool:
    try:
        client.set("sentin8:probe", "1")
        return True
    except Exception:
        return False


# ---- the cluster's own scripts in a 3-master cluster ---------------------------------------------------------


def test_registry_scan_covers_every_master(valkey_cluster):  # noqa: F811
    client = valkey_cluster.client()
    for n in range(60):  # 60 keys land on all three masters
        value = {"host": "10.0.0.1", "port": 1000 + n, "state": "Active", "health_ts": time.time()}
        client.hset(f"captain:svc:s{n}", "i", json.dumps(value))
    client.set("captain:svc:broken", "not a hash")
    sizes = []
    for port in valkey_cluster.ports:
        with redis.Redis(host="127.0.0.1", port=port) as node:
            sizes.append(node.dbsize())
    assert all(sizes), sizes

    async def main():
        target = load_bytes(f"[sources]\n{valkey_cluster.sources()}".encode()).sources_valkey()
        c = valkey_client.connect(target, connect_timeout_s=2, timeout_s=5)
        try:
            return await fetch_registry(c, batch=7)  # small batches: several per node
        finally:
            await valkey_client.close(c)

    got = asyncio.run(main())
    assert len(got.instances) == 60 and got.malformed == 1


CLUSTER = """
[sources]
{sources}
[cluster]
enabled = true
sync_interval_ms = 50
node_id = "{node}"
[policy]
rate_limit = true
rate_limit_rps = {rate}
rate_limit_burst = {burst}
"""


def test_two_hosts_admit_the_global_rate_through_a_cluster(valkey_cluster):  # noqa: F811
    """The limiter's SYNC and HEARTBEAT scripts in cluster mode: 4R over two hosts is admitted at R."""
    R, B = 40, 10

    def host(node: str):
        cfg = load_bytes(CLUSTER.format(sources=valkey_cluster.sources(), node=node, rate=R, burst=B).encode())
        assert cfg.cluster_valkey().mode == "cluster"
        table = tracked_table()
        return table, LimitSyncer(cfg, table, status(), lambda: cfg.policy)

    async def main():
        (a, sa), (b, sb) = host("a:443"), host("b:443")
        tasks = [asyncio.create_task(s.run()) for s in (sa, sb)]
        try:
            deadline = time.monotonic() + 10
            while not (sa.hosts == 2 and sb.hosts == 2 and sa.global_ and sb.global_):
                assert time.monotonic() < deadline, "both syncers global with H = 2"
                await asyncio.sleep(0.05)
            times = await _drive([a, b], 4 * R, 4.0, "198.18.0.9", R, B)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return times, (sa, sb)

    times, syncers = asyncio.run(main())
    in_window = sum(1 for t in times if 1.0 <= t < 4.0)
    assert 0.9 * 3 * R <= in_window <= 1.1 * 3 * R, (in_window, 3 * R)
    assert all(s.status.limiter == "global" for s in syncers)
    c = valkey_cluster.client()
    keys = c.keys(limiter_script.prefix("default") + "*", target_nodes=c.PRIMARIES)
    # the buckets and the hosts set live under one hash tag: one slot, so one script call per batch
    assert limiter_script.hosts_key("default").encode() in keys
    assert len({c.keyslot(k) for k in keys}) == 1


def test_the_policy_document_publishes_in_a_cluster(valkey_cluster):  # noqa: F811
    """The policy script writes the document and notifies on a channel of the same hash tag."""
    sub = valkey_cluster.client().pubsub(ignore_subscribe_messages=True)
    sub.subscribe(policy_doc.channel("edge"))

    async def main():
        target = load_bytes(f"[sources]\n{valkey_cluster.sources()}".encode()).sources_valkey()
        c = valkey_client.connect(target, connect_timeout_s=2, timeout_s=5)
        try:
            script = c.register_script(policy_doc.PUBLISH)
            keys = [policy_doc.doc_key("edge"), policy_doc.channel("edge")]
            first = await script(keys=keys, args=["{}", "a:443", "l1"])
            second = await script(keys=keys, args=["{}", "b:443", "l2"])
            return first, second, await c.hgetall(policy_doc.doc_key("edge"))
        finally:
            await valkey_client.close(c)

    first, second, fields = asyncio.run(main())
    assert int(first[0]) == 1 and int(second[0]) == 2 and second[1] == b"l1"  # one lineage, versions in order
    assert policy_doc.parse(fields).version.node == "b:443"
    msg = wait_until(lambda: sub.get_message(timeout=0.2), 5, what="the change notification")
    assert msg["data"] in (b"1", b"2")
