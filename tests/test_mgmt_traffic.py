"""The management plane with traffic: runtime policy reaching every worker, /health through an outage and a
drain, and the mgmt process killed under load."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tests import mgmt_client as mc
from tests.netns import external_host  # noqa: F401 - fixture
from tests.peers import one_web_service, wait_until
from tests.pqclient import PQClient
from tests.test_fleet_live import Platform, hostname, routes_to

SNI = "shop.apps.test"
GET = b"GET /x HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n"



def status_of(host, fleet) -> int:
    """One request on a new connection: the kernel spreads new connections over both workers."""
    client = PQClient(host.connect(fleet.port), SNI)
    try:
        client.handshake()
        resp = client.request(GET)
    finally:
        client.close()
    return int(resp.split(b" ", 2)[1])


def rate_limited_slots(fleet) -> dict[int, int]:
    _, stats = mc.get_json(fleet.mgmt_url, "/stats", mc.token(fleet.secret))
    return {w["slot"]: w["policy_rate_limit"] for w in stats["workers"]}


def put_policy(fleet, body) -> dict:
    status, _, raw = mc.call(fleet.mgmt_url, "PUT", "/policy", mc.token(fleet.secret, scope="policy-admin"), body)
    assert status == 200, raw
    import json

    return json.loads(raw)


def test_runtime_rate_limit_reaches_both_workers_survives_respawn_and_restart(external_host, fleet_factory, web):  # noqa: F811
    fleet = fleet_factory(one_web_service(web.port, SNI), host="0.0.0.0", mgmt=True)
    wait_until(lambda: mc.call(fleet.mgmt_url, "GET", "/health")[0] == 200, 10, what="mgmt up")
    assert all(status_of(external_host, fleet) == 200 for _ in range(6))

    view = put_policy(fleet, {"rate_limit": True, "rate_limit_rps": 0.01, "rate_limit_burst": 1})
    t0 = time.monotonic()
    assert view["effective"]["rate_limit"] is True and view["config"]["rate_limit"] is False
    # the next requests from this client get 429, from both workers, within 1 s of the change
    statuses = [status_of(external_host, fleet)]
    if statuses[0] != 429:  # the burst of 1 may admit one
        statuses.append(status_of(external_host, fleet))
    first_429 = time.monotonic() - t0
    assert statuses[-1] == 429 and first_429 < 1.0, (statuses, first_429)
    # the change's event line comes through the fleet's output pipe after the PUT's answer: waited for, not raced
    wait_until(lambda: fleet.saw("policy_changed"), 5, what="the policy_changed line")
    assert fleet.events("policy_changed")[-1]["sub"] == "tester"
    statuses = [status_of(external_host, fleet) for _ in range(12)]
    assert statuses == [429] * 12, statuses
    slots = wait_until(lambda: (s := rate_limited_slots(fleet)) and sum(1 for v in s.values() if v) >= 2 and s, 5,
                       what="429 counted by two workers")
    assert sum(1 for v in slots.values() if v) >= 2, slots

    # a SIGKILLed worker comes back with the runtime policy (it is in shared memory, not in the worker)
    victim = next(iter(fleet.workers()))
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: len(fleet.workers()) == 2 and victim not in fleet.workers(), 10, what="worker respawned")
    wait_until(lambda: mc.get_json(fleet.mgmt_url, "/health")[1]["workers"] == 2, 10, what="both listening")
    assert all(status_of(external_host, fleet) == 429 for _ in range(8))

    # a fleet restart keeps it (persisted in tls.state_dir)
    fleet.stop()
    again = fleet_factory(one_web_service(web.port, SNI), host="0.0.0.0", mgmt=True)
    assert again.saw("runtime_policy_loaded")
    statuses = [status_of(external_host, again) for _ in range(6)]
    assert statuses.count(429) >= 5, statuses  # new shared memory, new buckets: the burst of 1 may admit one

    # off: requests pass again at once
    put_policy(again, {"rate_limit": False})
    assert all(status_of(external_host, again) == 200 for _ in range(6))
    # DELETE returns to the config file's values
    status, _, _ = mc.call(again.mgmt_url, "DELETE", "/policy", mc.token(again.secret, scope="policy-admin"))
    assert status == 200
    _, view = mc.get_json(again.mgmt_url, "/policy", mc.token(again.secret, scope="policy-admin"))
    assert view["overlay"] == {} and view["effective"] == view["config"]


def test_health_draining_503_while_a_request_is_in_flight(external_host, fleet_factory, web):  # noqa: F811
    fleet = fleet_factory(one_web_service(web.port, SNI), host="0.0.0.0", mgmt=True)
    wait_until(lambda: mc.call(fleet.mgmt_url, "GET", "/health")[0] == 200, 10, what="mgmt up")
    result: dict[str, bytes] = {}

    def slow() -> None:
        client = PQClient(external_host.connect(fleet.port), SNI)
        client.handshake()
        result["resp"] = client.request(b"GET /slow/1 HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n")
        client.close()

    t = threading.Thread(target=slow, daemon=True)
    t.start()
    assert web.slow_started.wait(10)
    status, health = mc.get_json(fleet.mgmt_url, "/health")
    assert status == 200 and health["active_connections"] == 1
    fleet.signal(signal.SIGTERM)
    status, health = wait_until(lambda: (r := mc.get_json(fleet.mgmt_url, "/health"))[0] == 503 and r, 5,
                                what="draining")
    assert health["status"] == "draining" and health["active_connections"] == 1
    web.release_slow.set()
    t.join(10)
    assert result["resp"].startswith(b"HTTP/1.1 200")
    assert fleet.proc.wait(15) == 0  # the mgmt process goes with the fleet


@pytest.fixture
def platform(redis_server, postgres_server) -> Platform:
    return Platform(redis_server, postgres_server)


def test_health_turns_stale_during_a_valkey_outage(platform, backend_factory, fleet_factory):
    a = backend_factory("a", hostname("shop"))
    platform.set_instance("shop", "shop-a", a.port)
    platform.add_app("shop", "shop")
    fleet = fleet_factory("", extra=platform.sources(), mgmt=True)
    wait_until(lambda: routes_to(fleet.port, hostname("shop"), b"a"), 5, what="shop serving")
    status, health = wait_until(lambda: (r := mc.get_json(fleet.mgmt_url, "/health"))[0] == 200 and r, 10,
                                what="health")
    assert health["status"] == "ok" and health["stale"] is False
    platform.redis.stop(kill=True)
    status, health = wait_until(lambda: (r := mc.get_json(fleet.mgmt_url, "/health"))[1]["stale"] and r, 15,
                                what="stale")
    assert status == 200 and health["status"] == "stale"  # still serving: a load balancer keeps us
    assert routes_to(fleet.port, hostname("shop"), b"a")
    platform.redis.start()
    platform.set_instance("shop", "shop-a", a.port)
    wait_until(lambda: mc.get_json(fleet.mgmt_url, "/health")[1]["status"] == "ok", 20, what="ok again")


def test_killing_mgmt_under_load_costs_no_client_error(external_host, fleet_factory, web):  # noqa: F811
    fleet = fleet_factory(one_web_service(web.port, SNI), host="0.0.0.0", mgmt=True)
    wait_until(lambda: mc.call(fleet.mgmt_url, "GET", "/health")[0] == 200, 10, what="mgmt up")
    stop = threading.Event()
    outcomes: list[int | str] = []

    def load() -> None:
        client = PQClient(external_host.connect(fleet.port), SNI)
        client.handshake()
        while not stop.is_set():
            try:
                outcomes.append(int(client.request(GET).split(b" ", 2)[1]))
            except Exception as exc:  # any failure is a client error
                outcomes.append(repr(exc))
                return
        client.close()

    threads = [threading.Thread(target=load, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: len(outcomes) >= 50, 15, what="traffic flowing")
    pids = [p for p, title in fleet.children().items() if title.endswith(": mgmt")]
    assert len(pids) == 1
    before = len(outcomes)
    os.kill(pids[0], signal.SIGKILL)
    t0 = time.monotonic()
    status, _ = mc.get_json(fleet.mgmt_url, "/health")  # queued in the kept socket until the new process
    back = time.monotonic() - t0
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join(10)
    assert status == 200 and back < 1.0, back
    assert len(outcomes) > before  # traffic flowed across the kill
    assert all(o == 200 for o in outcomes), [o for o in outcomes if o != 200][:5]
    print(f"mgmt back after {back * 1000:.0f} ms; {len(outcomes)} requests, 0 errors")
