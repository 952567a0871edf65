"""The walking skeleton end to end: real fleet processes, real sockets, backends with their own TLS."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.peers import connection_closed, refusing_port, roundtrip, tls_client, wait_until


def two_services(a, b) -> str:
    return f"""
[[instances]]
service = "alpha"
id = "alpha-1"
host = "127.0.0.1"
port = {a.port}
tls = true
[[instances]]
service = "beta"
id = "beta-1"
host = "127.0.0.1"
port = {b.port}
tls = true
[[domains]]
hostname = "alpha.test"
service = "alpha"
[[domains]]
hostname = "*.beta.test"
service = "beta"
"""


def test_workers_are_titled_and_pinned(backend_factory, fleet_factory):
    a, b = backend_factory("a", "alpha.test"), backend_factory("b", "x.beta.test")
    fleet = fleet_factory(two_services(a, b), workers=2)
    workers = fleet.workers()
    assert len(workers) == 2
    cpus = sorted(os.sched_getaffinity(0))
    for index in range(2):
        pid = next(p for p, t in workers.items() if f"worker {index} " in t)
        cpu = cpus[index % len(cpus)]
        assert f"sentin8-proxy: worker {index} [cpu {cpu}]" in workers[pid]
        allowed = next(
            line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if "Cpus_allowed_list" in line
        )
        assert allowed.split()[-1] == str(cpu)
    titles = set(fleet.children().values())
    assert any("sentin8-proxy: resolver" in t for t in titles)
    assert "sentin8-proxy: supervisor" in Path(f"/proc/{fleet.proc.pid}/cmdline").read_text()


def test_internal_client_reaches_the_right_backend_and_its_own_certificate(backend_factory, fleet_factory):
    a, b = backend_factory("a", "alpha.test"), backend_factory("b", "x.beta.test")
    fleet = fleet_factory(two_services(a, b))
    for _ in range(5):
        with tls_client(fleet.port, "alpha.test") as s:
            assert s.getpeercert(binary_form=True) == a.cert_der  # the proxy never terminated it
            s.sendall(b"hello")
            assert s.recv(100) == b"a:hello"
        with tls_client(fleet.port, "X.Beta.Test") as s:  # wildcard, case-insensitive
            assert s.getpeercert(binary_form=True) == b.cert_der
            s.sendall(b"hello")
            assert s.recv(100) == b"b:hello"


def test_unknown_or_missing_sni_is_closed(backend_factory, fleet_factory):
    a, b = backend_factory("a", "alpha.test"), backend_factory("b", "x.beta.test")
    fleet = fleet_factory(two_services(a, b))
    for sni in ("nope.test", "beta.test", "a.b.beta.test"):  # a wildcard answers one label only
        try:
            roundtrip(fleet.port, sni)
            raise AssertionError(f"{sni} was routed")
        except (ssl.SSLError, ConnectionError, OSError):
            pass
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    raw = socket.create_connection(("127.0.0.1", fleet.port), timeout=5)
    try:
        with ctx.wrap_socket(raw):  # no server_hostname: no SNI
            raise AssertionError("a hello without SNI was routed")
    except (ssl.SSLError, ConnectionError, OSError):
        pass
    assert a.connections == 0 and b.connections == 0


def _client_hello_bytes(sni: str) -> tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO, bytes]:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=sni)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return obj, incoming, outgoing, outgoing.read()


def test_dribbled_client_hello_still_routes(backend_factory, fleet_factory):
    a, b = backend_factory("a", "alpha.test"), backend_factory("b", "x.beta.test")
    fleet = fleet_factory(two_services(a, b))
    obj, incoming, outgoing, hello = _client_hello_bytes("alpha.test")
    sock = socket.create_connection(("127.0.0.1", fleet.port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for i in range(0, len(hello), 7):  # many segments, each its own write
        sock.sendall(hello[i : i + 7])
        time.sleep(0.002)  # traffic shape (a slow peer), not synchronisation
    while True:  # finish the handshake through the proxy with the same TLS object
        try:
            obj.do_handshake()
            break
        except ssl.SSLWantReadError:
            if outgoing.pending:
                sock.sendall(outgoing.read())
            data = sock.recv(65536)
            assert data, "proxy closed a dribbled hello"
            incoming.write(data)
    if outgoing.pending:
        sock.sendall(outgoing.read())
    obj.write(b"slow")
    sock.sendall(outgoing.read())
    while True:
        try:
            assert obj.read(100) == b"a:slow"
            break
        except ssl.SSLWantReadError:
            incoming.write(sock.recv(65536))
    sock.close()


def test_silent_peer_closed_at_deadline_without_blocking_others(backend_factory, fleet_factory):
    a, b = backend_factory("a", "alpha.test"), backend_factory("b", "x.beta.test")
    fleet = fleet_factory(two_services(a, b), workers=1)  # one worker: a blocked loop would show
    silent = [socket.create_connection(("127.0.0.1", fleet.port)) for _ in range(20)]
    started = time.monotonic()
    assert roundtrip(fleet.port, "alpha.test", b"meanwhile") == b"a:meanwhile"
    assert time.monotonic() - started < 1.5
    for s in silent:
        assert connection_closed(s, timeout=6)
        s.close()
    assert time.monotonic() - started >= 1.5  # peek_timeout_s = 2 in the test config
    garbage = socket.create_connection(("127.0.0.1", fleet.port))
    garbage.sendall(b"GET / HTTP/1.1\r\nHost: alpha.test\r\n\r\n")
    assert connection_closed(garbage, timeout=1)  # not TLS: closed at once, not at the deadline
    garbage.close()


def test_one_dead_instance_of_two_every_connection_succeeds(backend_factory, fleet_factory):
    a = backend_factory("a", "alpha.test")
    dead = refusing_port()  # held, never listening: connect is refused
    dead_port = dead.getsockname()[1]
    fleet = fleet_factory(
        f"""
[[instances]]
service = "alpha"
id = "alpha-dead"
host = "127.0.0.1"
port = {dead_port}
[[instances]]
service = "alpha"
id = "alpha-1"
host = "127.0.0.1"
port = {a.port}
[[domains]]
hostname = "alpha.test"
service = "alpha"
"""
    )
    for i in range(20):
        assert roundtrip(fleet.port, "alpha.test", b"%d" % i) == b"a:%d" % i


def test_killed_worker_is_replaced_and_traffic_continues(backend_factory, fleet_factory):
    a, b = backend_factory("a", "alpha.test"), backend_factory("b", "x.beta.test")
    fleet = fleet_factory(two_services(a, b))
    before = fleet.workers()
    victim = next(iter(before))
    os.kill(victim, signal.SIGKILL)
    after = wait_until(
        lambda: (w := fleet.workers()) and len(w) == 2 and victim not in w and w, 10, what="worker respawn"
    )
    assert victim not in after
    for _ in range(10):
        assert roundtrip(fleet.port, "alpha.test") == b"a:ping"


def test_sigterm_lets_an_open_pipe_finish_then_exits_zero(backend_factory, fleet_factory):
    a, b = backend_factory("a", "alpha.test"), backend_factory("b", "x.beta.test")
    fleet = fleet_factory(two_services(a, b))
    with tls_client(fleet.port, "alpha.test") as s:
        s.sendall(b"before")
        assert s.recv(100) == b"a:before"
        fleet.signal(signal.SIGTERM)
        wait_until(lambda: fleet.saw("drain"), 5, what="drain")
        # new connections are no longer accepted once the listeners close
        wait_until(lambda: _refused(fleet.port), 5, what="listeners closed")
        for i in range(3):  # the open pipe keeps working during the drain
            s.sendall(b"during%d" % i)
            assert s.recv(100) == b"a:during%d" % i
    assert fleet.proc.wait(15) == 0


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return False
    except ConnectionRefusedError:
        return True


def test_counters_are_shared_and_summed_across_workers(backend_factory, fleet_factory):
    a, b = backend_factory("a", "alpha.test"), backend_factory("b", "x.beta.test")
    fleet = fleet_factory(two_services(a, b))
    for _ in range(6):
        roundtrip(fleet.port, "alpha.test")
    for sni in ("nope.test", "nope2.test"):
        try:
            roundtrip(fleet.port, sni)
        except (ssl.SSLError, OSError):
            pass
    garbage = socket.create_connection(("127.0.0.1", fleet.port))
    garbage.sendall(b"\x00" * 10)
    assert connection_closed(garbage)
    stats = wait_until(lambda: (s := fleet.stats()).get("l4_bytes_in") and s, 5, what="pipes closed")
    assert stats["connections_l4"] >= 8
    assert stats["unknown_sni"] == 2
    assert stats["peek_garbage"] == 1
    assert stats["accepted"] >= 9
    assert stats.get("l4_active", 0) == 0 or stats["l4_active"] <= 1


def test_sighup_rereads_file_sources_and_replaces_workers_one_by_one(backend_factory, fleet_factory):
    a, b = backend_factory("a", "alpha.test"), backend_factory("b", "x.beta.test")
    fleet = fleet_factory(two_services(a, b))
    assert roundtrip(fleet.port, "alpha.test") == b"a:ping"
    old_workers = set(fleet.workers())
    # point alpha.test at beta's backend, then reload
    text = (
        Path(fleet.config)
        .read_text()
        .replace('hostname = "alpha.test"\nservice = "alpha"', 'hostname = "alpha.test"\nservice = "beta"')
    )
    Path(fleet.config).write_text(text)
    fleet.signal(signal.SIGHUP)
    wait_until(lambda: roundtrip(fleet.port, "alpha.test") == b"b:ping", 10, what="new mapping")
    new = wait_until(
        lambda: (w := set(fleet.workers())) and not (w & old_workers) and len(w) == 2 and w,
        15,
        what="all workers replaced",
    )
    assert len(new) == 2


def test_file_change_is_picked_up_without_a_signal(backend_factory, fleet_factory):
    a, b = backend_factory("a", "alpha.test"), backend_factory("b", "x.beta.test")
    fleet = fleet_factory(two_services(a, b))
    text = Path(fleet.config).read_text() + '\n[[domains]]\nhostname = "gamma.test"\nservice = "alpha"\n'
    Path(fleet.config).write_text(text)
    wait_until(lambda: _routes(fleet.port, "gamma.test"), 10, what="new domain routed")


def test_an_l4_refusal_is_a_fin_never_a_reset(backend_factory, fleet_factory):
    """A reset is what a client sees when its connection is lost (a listener's queue, a worker that died);
    a refusal is a close (fail closed, no alert: only the backend's TLS speaks to an internal client). The
    peeked ClientHello is read first: a close with unread bytes would be a reset too (CI's one reset after
    the routing table emptied mid-write could not say it was a name with no route)."""
    a = backend_factory("a", "alpha.test")
    held = refusing_port()  # beta's only instance: held, never listening, so its connect is refused
    nobody = SimpleNamespace(port=held.getsockname()[1])
    fleet = fleet_factory(two_services(a, nobody), workers=1)
    with pytest.raises(ssl.SSLEOFError):  # a FIN mid-handshake; a reset raises ConnectionResetError
        roundtrip(fleet.port, "nope.test")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with pytest.raises(ssl.SSLEOFError):
        ctx.wrap_socket(socket.create_connection(("127.0.0.1", fleet.port), timeout=5))  # no SNI at all
    with pytest.raises(ssl.SSLEOFError):
        roundtrip(fleet.port, "x.beta.test")
    stats = fleet.stats()
    assert (stats["unknown_sni"], stats["no_sni"], stats["backend_connect_errors"]) == (1, 1, 1)
    assert roundtrip(fleet.port, "alpha.test") == b"a:ping"


def test_a_config_file_caught_empty_mid_write_never_empties_the_routing_table(backend_factory, fleet_factory):
    """``Path.write_text`` truncates, then writes: a resolver check in between used to publish the empty
    file's tables (valid TOML, no domains), and every L4 client was reset (its SNI unknown, its ClientHello
    unread) until the next check. CI saw it once after a reload test rewrote its config."""
    a, b = backend_factory("a", "alpha.test"), backend_factory("b", "x.beta.test")
    fleet = fleet_factory(two_services(a, b), workers=1)
    config = Path(fleet.config)
    text = config.read_text()
    assert roundtrip(fleet.port, "alpha.test") == b"a:ping"
    with open(config, "w") as writer:  # held truncated, as a writer descheduled between O_TRUNC and write
        wait_until(lambda: fleet.saw("config_reload_failed"), 10, what="the empty file judged")
        assert "empty" in fleet.events("config_reload_failed")[-1]["reason"]
        assert roundtrip(fleet.port, "alpha.test") == b"a:ping"
        writer.write(text.replace('hostname = "alpha.test"', 'hostname = "gamma.test"'))
    wait_until(lambda: _routes(fleet.port, "gamma.test"), 10, what="the whole file routed")


def _routes(port: int, sni: str) -> bool:
    try:
        return roundtrip(port, sni) == b"a:ping"
    except (ssl.SSLError, OSError):
        return False


def test_ready_is_sent_to_systemd_once_workers_listen(backend_factory, tmp_path, monkeypatch):
    from tests.peers import Fleet

    a, b = backend_factory("a", "alpha.test"), backend_factory("b", "x.beta.test")
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    fleet = Fleet(str(tmp_path), two_services(a, b), 2)
    try:
        sock.settimeout(10)
        msg = sock.recv(4096).decode()
        assert "READY=1" in msg and f"MAINPID={fleet.proc.pid}" in msg
        assert roundtrip(fleet.port, "alpha.test") == b"a:ping"  # READY means serving
        fleet.signal(signal.SIGTERM)
        assert "STOPPING=1" in sock.recv(4096).decode()
        assert fleet.proc.wait(15) == 0
    finally:
        fleet.stop()
        sock.close()


def test_rolling_reloads_under_load_drop_no_connection(backend_factory, fleet_factory):
    import threading

    a, b = backend_factory("a", "alpha.test"), backend_factory("b", "x.beta.test")
    fleet = fleet_factory(two_services(a, b))
    stop = threading.Event()
    results = {"ok": 0, "errors": []}

    def load() -> None:
        while not stop.is_set():
            try:
                assert roundtrip(fleet.port, "alpha.test") == b"a:ping"
                results["ok"] += 1
            except Exception as exc:  # every failure counts: that is the assertion
                results["errors"].append(repr(exc))

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for _ in range(3):
            done = results["ok"]
            wait_until(lambda d=done: results["ok"] > d + 30, 20, what="load flowing")
            before = set(fleet.workers())
            fleet.signal(signal.SIGHUP)
            wait_until(lambda b=before: not (set(fleet.workers()) & b), 20, what="workers replaced")
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert results["ok"] > 90
    assert results["errors"] == []


def test_idle_pipes_hold_two_descriptors_each_not_six(backend_factory, fleet_factory):
    a, b = backend_factory("a", "alpha.test"), backend_factory("b", "x.beta.test")
    fleet = fleet_factory(two_services(a, b), workers=1)
    (pid,) = fleet.workers()
    assert roundtrip(fleet.port, "alpha.test") == b"a:ping"  # warm: the pipe pool exists
    base = len(os.listdir(f"/proc/{pid}/fd"))
    clients = []
    for i in range(50):
        s = tls_client(fleet.port, "alpha.test")
        s.sendall(b"%d" % i)
        assert s.recv(100) == b"a:%d" % i  # bytes moved through the splice pipes, then the pipe idles
        clients.append(s)
    held = len(os.listdir(f"/proc/{pid}/fd")) - base
    for s in clients:
        s.close()
    assert held <= 2 * 50 + 8, f"{held} descriptors for 50 idle pipes"


def test_half_close_is_forwarded_and_the_other_direction_keeps_flowing(fleet_factory):
    import threading

    from tests.hellos import pq_hello

    hello = pq_hello("raw.test")
    backend = socket.socket()
    backend.bind(("127.0.0.1", 0))
    backend.listen(1)

    def serve() -> None:
        conn, _ = backend.accept()
        got = b""
        while chunk := conn.recv(65536):  # until the client's EOF, passed on by the proxy
            got += chunk
        conn.sendall(b"read %d bytes after your EOF" % len(got))
        conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    fleet = fleet_factory(
        f"""
[[instances]]
service = "raw"
id = "raw-1"
host = "127.0.0.1"
port = {backend.getsockname()[1]}
[[domains]]
hostname = "raw.test"
service = "raw"
""",
        workers=1,
    )
    client = socket.create_connection(("127.0.0.1", fleet.port), timeout=10)
    client.sendall(hello + b"x" * 100_000)
    client.shutdown(socket.SHUT_WR)
    answer = b""
    while chunk := client.recv(65536):
        answer += chunk
    assert answer == b"read %d bytes after your EOF" % (len(hello) + 100_000)
    client.close()
    backend.close()
    t.join(5)


def test_out_of_descriptors_pauses_accept_instead_of_spinning(backend_factory, fleet_factory):
    import psutil

    a, b = backend_factory("a", "alpha.test"), backend_factory("b", "x.beta.test")
    fleet = fleet_factory(two_services(a, b), workers=1, nofile=96)
    (pid,) = fleet.workers()
    held = []
    try:
        for _ in range(80):  # each piped connection holds two descriptors in the worker
            try:
                s = tls_client(fleet.port, "alpha.test", timeout=2)
                s.sendall(b"x")
                s.recv(10)
                held.append(s)
            except (OSError, ssl.SSLError):
                break
        wait_until(lambda: fleet.stats().get("accept_errors", 0) > 0, 10, 0.2, what="EMFILE seen")
        proc = psutil.Process(pid)
        before = sum(proc.cpu_times()[:2])
        extra = [socket.create_connection(("127.0.0.1", fleet.port)) for _ in range(5)]  # queued, not accepted
        for s in extra:
            s.sendall(b"\x16\x03\x01")
        time.sleep(1.0)  # measuring CPU over a second of EMFILE pressure
        spent = sum(proc.cpu_times()[:2]) - before
        assert spent < 0.5, f"worker burned {spent:.2f} CPU-s in 1 s while out of descriptors"
        for s in extra:
            s.close()
    finally:
        for s in held:
            s.close()
    wait_until(lambda: _routes(fleet.port, "alpha.test"), 10, 0.2, what="accepting again")


def test_a_refused_hello_lingers_so_a_client_still_sending_reads_the_alert_and_a_fin(backend_factory, fleet_factory):
    """A hello over limits.peek_max_bytes is refused (an alert, then a FIN) while the client may still be
    sending: a socket closed with unread bytes answers with a reset instead of a FIN, and the reset can destroy
    the alert before the client reads it (CI saw `alert + reset` for a 40 KB hello once). The refused socket
    lingers: our FIN first, the peer's last bytes read and discarded (up to 16 MiB), then the close. Here the
    client sends more than the refusal's own read takes (256 KiB) before it reads anything."""
    import threading

    a = backend_factory("a", "alpha.test")
    fleet = fleet_factory(two_services(a, a), workers=1)
    record = b"\x16\x03\x01\x40\x00" + b"\x01" + b"\x00" * (0x4000 - 1)  # one 16 KiB handshake record
    with socket.create_connection(("127.0.0.1", fleet.port), timeout=10) as s:
        failed: list[BaseException] = []

        def send() -> None:
            try:
                s.sendall(record * 3 + b"\x00" * (400 * 1024))  # over the 32 KiB cap, then still sending
            except OSError as exc:
                failed.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        sender.join(10)
        got = b""
        while chunk := s.recv(4096):  # ConnectionResetError without the linger
            got += chunk
        assert got.startswith(b"\x15\x03") and len(got) == 7, got  # one fatal alert, then our FIN
        assert not failed, failed
