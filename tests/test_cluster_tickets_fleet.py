"""Session tickets that resume on any host (issue 19 §2), through two whole fleets (two supervisors with their own
shared memory: two hosts), one Valkey, external PQ TLS clients from a network namespace.

A ticket is one full handshake on host A; it is then offered to host B, which must resume it (with a fresh PQ key
exchange: the resumed connection's group is the PQ hybrid). Valkey's contents are scanned for the ticket keys,
which the test derives itself from the wrapped state (it knows the operator secret).
"""

from __future__ import annotations

import secrets
import time
from concurrent.futures import ThreadPoolExecutor
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
TICKETS = 200
PARALLEL = 3  # connections at a time: the fleets have two workers each


def _fleet(
    tmp_path: Path, name: str, web, valkey_url: str, secret: str, rotation_s: float = 3600, env: dict | None = None
) -> Fleet:
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
    return Fleet(
        str(workdir),
        body,
        workers=2,
        host="0.0.0.0",
        mgmt=True,
        extra=f"ticket_key_rotation_s = {rotation_s!r}",
        env={"SENTIN8_CLUSTER_SECRET": secret, **(env or {})},
    )


def rotation_with_a_boundary_in(seconds: float, period: float = 120.0) -> tuple[float, float]:
    """A ``tls.ticket_key_rotation_s`` just over ``period`` whose next epoch starts ``seconds`` from now, and that
    instant: epochs are ``floor(unix time / rotation_s)``, so a rotation at a chosen time is a choice of period,
    not a test knob in the proxy (nor a wait of up to a whole period). Tickets live one period (their lifetime
    hint), longer than the test."""
    boundary = time.time() + seconds
    k = int(boundary // period)
    return boundary / k, boundary


def _connect(ext, fleet: Fleet, session=None, context=None) -> PQClient:
    """One connection and one request (the server's tickets leave with its first write)."""
    c = PQClient(ext.connect(fleet.port), SNI, session=session, context=context)
    c.handshake()
    assert c.request(GET).startswith(b"HTTP/1.1 200 ")
    return c


def _tickets_from(ext, fleet: Fleet, n: int, issued: list[float] | None = None, threads: int = 1) -> list[tuple]:
    """``n`` tickets from full handshakes (``issued``: when each was issued, appended), on ``threads`` connections
    at a time."""
    if threads > 1:
        with ThreadPoolExecutor(threads) as pool:
            parts = list(pool.map(lambda k: _timed_tickets(ext, fleet, k), _split(n, threads)))
        pairs = sorted((p for part in parts for p in part), key=lambda p: p[1])
        if issued is not None:
            issued += [at for _, at in pairs]
        return [t for t, _ in pairs]
    pairs = _timed_tickets(ext, fleet, n)
    if issued is not None:
        issued += [at for _, at in pairs]
    return [t for t, _ in pairs]


def _timed_tickets(ext, fleet: Fleet, n: int) -> list[tuple[tuple, float]]:
    out = []
    for _ in range(n):
        c = _connect(ext, fleet)
        assert not c.resumed
        out.append(((c.session, c.context, c.group_name), time.time()))
        c.close()
    return out


def _split(n: int, parts: int) -> list[int]:
    return [n // parts + (i < n % parts) for i in range(parts)]


def _resume_on(ext, fleet: Fleet, tickets: list[tuple], threads: int = 1) -> tuple[int, int]:
    """(resumed, handshakes that failed): every offered ticket must give a working connection."""
    if threads > 1:
        with ThreadPoolExecutor(threads) as pool:
            counts = list(
                pool.map(lambda part: _resume_on(ext, fleet, part), [tickets[i::threads] for i in range(threads)])
            )
        return sum(r for r, _ in counts), sum(f for _, f in counts)
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


def test_200_tickets_from_host_a_resume_on_host_b_across_a_rotation_and_after_b_restarts(
    tmp_path,
    web,
    redis_server,
    external_host,  # noqa: F811
    secret,
):
    """200 tickets issued by A resume on B (>= 99%, 0 failed, PQ key exchange on every resumption); the ticket
    keys rotate (both hosts ratchet into the next epoch on their own clocks) and 200 more of A's tickets, sealed
    before the rotation under what is now the previous epoch's key, resume on B; B restarts (fresh shared memory,
    the cluster's ratchet again from Valkey before its workers start) and another 200 resume there.

    A client uses a TLS 1.3 ticket once (OpenSSL offers a session it resumed with no more), so each of the three
    checks has tickets of its own, all issued by A before the rotation."""
    rotation_s, boundary = rotation_with_a_boundary_in(32.0)
    a = _fleet(tmp_path, "a", web, redis_server.url, secret, rotation_s)
    b = _fleet(tmp_path, "b", web, redis_server.url, secret, rotation_s)
    try:
        for f in (a, b):
            wait_until(lambda f=f: health(f)["cluster"]["ticket_keys"] == "shared", 10, what="shared ticket keys")
        tickets = _tickets_from(external_host, a, TICKETS, threads=PARALLEL)
        assert tickets[0][2] == "X25519MLKEM768", tickets[0][2]
        resumed, failed = _resume_on(external_host, b, tickets, threads=PARALLEL)
        print(f"A -> B: {resumed}/{TICKETS} resumed, {failed} failed")
        assert failed == 0 and resumed >= 0.99 * TICKETS, resumed

        # the rotation: tickets issued before it are sealed under the key that is now the previous one
        issued: list[float] = []
        later = _tickets_from(external_host, a, 2 * TICKETS, issued, threads=PARALLEL)
        print(f"{len(later)} more tickets issued, {boundary - time.time():.1f} s before the rotation")
        before = [t for t, at in zip(later, issued, strict=True) if at < boundary - 0.5]
        assert len(before) >= TICKETS, f"the machine is too slow: {len(before)} tickets before the rotation"
        across, after_restart = before[0::2], before[1::2]  # each as many (at least 100), issued alike
        wait_until(lambda: time.time() > boundary + 0.5, max(1.0, boundary + 5 - time.time()), what="the rotation")
        resumed, failed = _resume_on(external_host, b, across, threads=PARALLEL)
        print(f"A -> B across the rotation: {resumed}/{len(across)} resumed, {failed} failed")
        assert failed == 0 and resumed >= 0.99 * len(across), resumed

        b.stop()  # B restarts: new shared memory, the cluster's keys again from Valkey
        b = _fleet(tmp_path, "b", web, redis_server.url, secret, rotation_s)
        assert health(b)["cluster"]["ticket_keys"] == "shared"  # adopted before the workers started
        resumed, failed = _resume_on(external_host, b, after_restart, threads=PARALLEL)
        print(f"A -> restarted B, after the rotation: {resumed}/{len(after_restart)} resumed, {failed} failed")
        assert failed == 0 and resumed >= 0.99 * len(after_restart), resumed
        fresh = _tickets_from(external_host, a, 20)  # the new epoch's tickets too, and the other way round
        assert _resume_on(external_host, b, fresh) == (20, 0)
        back = _tickets_from(external_host, b, 10)
        assert _resume_on(external_host, a, back) == (10, 0)
        assert time.time() < boundary + rotation_s  # all of it within one epoch of the rotation

        # Valkey holds the wrapped state only: no ticket key, no ratchet secret, in any key's name or value
        client = redis.Redis.from_url(redis_server.url)
        kek = ticket_state.derive_kek(secret.encode(), "default")
        state = ticket_state.unwrap(kek, "default", client.get(ticket_state.state_key("default")))
        epoch = int(time.time() // rotation_s)
        raw: list[bytes] = []
        held = {**ticket_state.secrets(state, epoch), **ticket_state.secrets(state, epoch + 1)}
        assert {epoch - 1, epoch} <= held.keys()  # the epoch the tickets were sealed in, and this one
        for e, s in held.items():
            key = TicketKey.derive(e, s)
            raw += [s, key.hmac_key, key.aes_key]
        raw += [state.secret]
        keys = list(client.scan_iter(count=1000))
        assert keys
        dumped = b"".join(k + (client.dump(k) or b"") for k in keys)
        assert not [r for r in raw if r in dumped]
        # and a wrong secret cannot unwrap what is there
        with pytest.raises(ticket_state.UnwrapError):
            ticket_state.unwrap(
                ticket_state.derive_kek(b"w" * 32, "default"), "default", client.get(ticket_state.state_key("default"))
            )
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


def test_host_b_reads_the_secret_from_a_systemd_credential(
    tmp_path,
    web,
    redis_server,
    external_host,  # noqa: F811
    secret,
):
    """B runs as systemd's ``LoadCredential=`` would start it: the secret in ``$CREDENTIALS_DIRECTORY`` (with the
    newline ``echo`` leaves), its environment variable holding something else: the credential wins, B unwraps A's
    state and resumes A's tickets."""
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "sentin8-cluster-secret").write_text(secret + "\n")
    (creds / "sentin8-cluster-secret").chmod(0o400)
    a = _fleet(tmp_path, "a", web, redis_server.url, secret)
    b = _fleet(
        tmp_path,
        "b",
        web,
        redis_server.url,
        secrets.token_urlsafe(36),  # the variable: not the cluster's secret
        env={"CREDENTIALS_DIRECTORY": str(creds)},
    )
    try:
        for f in (a, b):
            wait_until(lambda f=f: health(f)["cluster"]["ticket_keys"] == "shared", 10, what="shared ticket keys")
        assert not b.saw("cluster_tickets") or all(
            e.get("ticket_keys") == "shared" for e in b.events("cluster_tickets")
        )
        assert _resume_on(external_host, b, _tickets_from(external_host, a, 5)) == (5, 0)
    finally:
        a.stop()
        b.stop()
