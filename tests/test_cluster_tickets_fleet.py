"""Session tickets that resume on any host (issue 19 §2), through two whole fleets (two supervisors with their own
shared memory: two hosts), one Valkey, external PQ TLS clients from a network namespace.

A ticket is one full handshake on host A; it is then offered to host B, which must resume it (with a fresh PQ key
exchange: the resumed connection's group is the PQ hybrid). Valkey's contents are scanned for the ticket keys,
which the test derives itself from the wrapped state (it knows the operator secret).
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
import redis

from sentin8.cluster import ticket_state
from sentin8.ticketkeys import TicketKey
from tests.netns import external_host  # noqa: F401 - fixture
from tests.peers import Fleet, wait_until
from tests.pqclient import PQClient
from tests.test_cluster_fleet import health

pytestmark = pytest.mark.netns

GET = b"GET /x HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n"
SNI = "shop.apps.test"
TICKETS = 60


def _fleet(tmp_path: Path, name: str, web, valkey_url: str, secret: str) -> Fleet:
    workdir = tmp_path / name
    workdir.mkdir(exist_ok=True)
    body = f"""
[cluster]
enabled = true
valkey_url = "{valkey_url}"
node_id = "{name}"
[[instances]]
service = "web"
id = "web-1"
host = "127.0.0.1"
port = {web.port}
[[domains]]
hostname = "{SNI}"
service = "web"
"""
    return Fleet(str(workdir), body, workers=2, host="0.0.0.0", mgmt=True, env={"SENTIN8_CLUSTER_SECRET": secret})


def _connect(ext, fleet: Fleet, session=None, context=None) -> PQClient:
    """One connection and one request (the server's tickets leave with its first write)."""
    c = PQClient(ext.connect(fleet.port), SNI, session=session, context=context)
    c.handshake()
    assert c.request(GET).startswith(b"HTTP/1.1 200 ")
    return c


def _tickets_from(ext, fleet: Fleet, n: int) -> list[tuple]:
    out = []
    for _ in range(n):
        c = _connect(ext, fleet)
        assert not c.resumed
        out.append((c.session, c.context, c.group_name))
        c.close()
    return out


def _resume_on(ext, fleet: Fleet, tickets: list[tuple]) -> tuple[int, int]:
    """(resumed, handshakes that failed): every offered ticket must give a working connection."""
    resumed = failed = 0
    for session, context, group in tickets:
        try:
            c = _connect(ext, fleet, session, context)
        except Exception:
            failed += 1
            continue
        if c.resumed:
            resumed += 1
            assert c.group_name == group  # (EC)DHE with the PQ hybrid on resumption too, never psk_ke
        c.close()
    return resumed, failed


@pytest.fixture
def secret() -> str:
    return secrets.token_urlsafe(36)


def test_tickets_from_host_a_resume_on_host_b_also_after_b_restarts(
    tmp_path,
    web,
    redis_server,
    external_host,  # noqa: F811
    secret,
):
    a = _fleet(tmp_path, "a", web, redis_server.url, secret)
    b = _fleet(tmp_path, "b", web, redis_server.url, secret)
    try:
        for f in (a, b):
            wait_until(lambda f=f: health(f)["cluster"]["ticket_keys"] == "shared", 10, what="shared ticket keys")
        tickets = _tickets_from(external_host, a, TICKETS)
        assert tickets[0][2] == "X25519MLKEM768", tickets[0][2]
        resumed, failed = _resume_on(external_host, b, tickets)
        print(f"A -> B: {resumed}/{TICKETS} resumed, {failed} failed")
        assert failed == 0 and resumed >= 0.99 * TICKETS, resumed

        b.stop()  # B restarts: new shared memory, the cluster's keys again from Valkey
        b = _fleet(tmp_path, "b", web, redis_server.url, secret)
        assert health(b)["cluster"]["ticket_keys"] == "shared"  # adopted before the workers started
        tickets = _tickets_from(external_host, a, TICKETS // 2)
        resumed, failed = _resume_on(external_host, b, tickets)
        print(f"A -> restarted B: {resumed}/{TICKETS // 2} resumed, {failed} failed")
        assert failed == 0 and resumed >= 0.99 * (TICKETS // 2), resumed
        back = _tickets_from(external_host, b, 10)  # and the other way round
        assert _resume_on(external_host, a, back) == (10, 0)

        # Valkey holds the wrapped state only: no ticket key, no ratchet secret, in any key's name or value
        client = redis.Redis.from_url(redis_server.url)
        kek = ticket_state.derive_kek(secret.encode(), "default")
        state = ticket_state.unwrap(kek, "default", client.get(ticket_state.state_key("default")))
        raw: list[bytes] = []
        for e, s in ticket_state.secrets(state, state.epoch + 1).items():  # the state's epoch and the next
            key = TicketKey.derive(e, s)
            raw += [s, key.hmac_key, key.aes_key]
        raw += [state.secret]
        keys = list(client.scan_iter(count=1000))
        assert keys
        dumped = b"".join(k + (client.dump(k) or b"") for k in keys)
        assert not [r for r in raw if r in dumped]
        client.close()
    finally:
        a.stop()
        b.stop()


def test_valkey_down_at_b_start_means_full_handshakes_never_failed_ones(
    tmp_path,
    web,
    redis_server,
    external_host,  # noqa: F811
    secret,
):
    a = _fleet(tmp_path, "a", web, redis_server.url, secret)
    b = None
    try:
        wait_until(lambda: health(a)["cluster"]["ticket_keys"] == "shared", 10, what="A shares its ticket keys")
        tickets = _tickets_from(external_host, a, 20)
        redis_server.stop(kill=True)
        b = _fleet(tmp_path, "b", web, redis_server.url, secret)
        assert health(b)["cluster"]["ticket_keys"] == "local"
        resumed, failed = _resume_on(external_host, b, tickets)
        print(f"Valkey down at B's start: {resumed}/20 resumed, {failed} failed")
        assert failed == 0 and resumed == 0
        home = _tickets_from(external_host, b, 5)  # B's own tickets still resume at home
        assert _resume_on(external_host, b, home) == (5, 0)
        # Valkey back (empty: this one keeps no data across a restart): the first host to reach it writes the
        # state, the other adopts it within its poll interval, and A's tickets resume on B again
        redis_server.start()
        wait_until(lambda: health(b)["cluster"]["ticket_keys"] == "shared", 10, what="B shares again")
        wait_until(
            lambda: _resume_on(external_host, b, _tickets_from(external_host, a, 1)) == (1, 0),
            15,
            interval=0.2,
            what="both hosts on one state",
        )
        tickets = _tickets_from(external_host, a, 10)
        assert _resume_on(external_host, b, tickets) == (10, 0)
    finally:
        a.stop()
        if b is not None:
            b.stop()


def test_a_host_with_another_secret_cannot_unwrap_and_stays_local(
    tmp_path,
    web,
    redis_server,
    external_host,  # noqa: F811
    secret,
):
    a = _fleet(tmp_path, "a", web, redis_server.url, secret)
    b = _fleet(tmp_path, "b", web, redis_server.url, secrets.token_urlsafe(36))
    try:
        wait_until(lambda: health(a)["cluster"]["ticket_keys"] == "shared", 10, what="A shares its ticket keys")
        wait_until(lambda: b.saw("cluster_tickets"), 10, what="B's complaint")
        assert health(b)["cluster"]["ticket_keys"] == "local"
        assert any("does not authenticate" in e.get("reason", "") for e in b.events("cluster_tickets"))
        resumed, failed = _resume_on(external_host, b, _tickets_from(external_host, a, 5))
        assert (resumed, failed) == (0, 0)
        assert health(a)["cluster"]["ticket_keys"] == "shared"  # B never overwrote the cluster's state
    finally:
        a.stop()
        b.stop()
