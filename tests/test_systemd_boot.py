"""The unit booted under a real systemd (issue 20 item 4): a Debian 12 tree with systemd as PID 1
(``tests/nspawn.py``), the project installed by the README's install block run line for line, and the fleet
checked through the unit's whole life: READY, workers forked and pinned under the sandbox, :443 bound by the
unprivileged user, an L4 splice and an L7 request (PQ TLS, WAF) served, Valkey and PostgreSQL reached, a reload
done, two reloads refused, a stop that drains and exits 0, and a taken port that fails without a restart loop.

Skipped, with the reason, where it cannot run: not root, the tree or the wheels cannot be built (no Debian
mirror or PyPI), nspawn cannot boot systemd here, or something else holds :443. The first run builds the tree
(mmdebstrap, 100-150 s) and the wheelhouse (~15 s) into /var/cache/sentin8-systemd; later runs take ~40 s idle.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import time

import pytest

from tests import debian_tree
from tests.mgmt_client import call, token
from tests.netns import external_host  # noqa: F401 - fixture
from tests.nspawn import BootFailed, Container
from tests.peers import HTTPBackend, TLSBackend, free_port, tls_client, wait_until
from tests.pqclient import PQClient
from tests.test_fleet_live import Platform, hostname

UNIT = "sentin8-proxy"
CHECKOUT = "/root/sentin8-proxy"  # where the staged checkout is, in the container (the install block's cwd)
WHEELHOUSE = "/var/cache/wheelhouse"
DRAIN_S = 20  # fleet.drain_timeout_s: long enough that a drain ended by its last connection is told apart
CAP_NET_BIND_SERVICE = 1 << 10
# nspawn mounts /proc/sys read-only; the container shares the host's network namespace, whose setting the
# drop-in is: the host applies it (below) and the block's `sysctl --system` is told so
SYSCTL_SHIM = 'sysctl() { echo "sysctl $*: applied by the host (nspawn: /proc/sys is read-only here)"; }\n'

pytestmark = pytest.mark.timeout(1500)  # a first run builds the tree (mmdebstrap) before it boots


def install_block() -> str:
    """The shell block under "Running under systemd" that installs the unit (the one with ``useradd``)."""
    docs = [debian_tree.REPO / "README.md", *sorted((debian_tree.REPO / "docs").glob("**/*.md"))]
    for doc in docs:
        in_section, block = False, None
        for line in doc.read_text().splitlines():
            if block is not None:  # inside a fence: a "# comment" there is no heading
                if line.startswith("```"):
                    if "useradd" in "".join(block):
                        return "".join(block)
                    block = None
                else:
                    block.append(line + "\n")
            elif line.startswith("#"):
                in_section = bool(re.match(r"#+ Running under systemd$", line))
            elif in_section and line.startswith("```"):
                block = [] if line.strip() == "```sh" else None
    raise AssertionError(f"no install block (```sh with useradd) under 'Running under systemd' in {docs}")


def fleet_config(platform: Platform, mgmt_port: int) -> str:
    return f"""
[listen]
https = "0.0.0.0:443"
http = ""
mgmt = "127.0.0.1:{mgmt_port}"
[fleet]
workers = 2
drain_timeout_s = {DRAIN_S}
[limits]
max_connections_per_ip = 100
[policy]
waf = true
rate_limit = true
rate_limit_rps = 1000
[metrics]
interval_s = 1
{platform.sources(health_fresh_s=3600)}
"""


class Unit:
    """The unit inside the booted container: systemctl, its journal, its processes."""

    def __init__(self, box: Container) -> None:
        self.box = box

    def systemctl(self, *args: str, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.box.run("systemctl", *args, check=check, timeout=timeout)

    def show(self, *props: str) -> dict[str, str]:
        out = self.systemctl("show", UNIT, *(f"--property={p}" for p in props), check=True).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self) -> str:
        return self.box.run("journalctl", "--no-pager", "-o", "cat", "-u", UNIT, check=False).stdout

    def events(self, name: str) -> list[dict]:
        out = []
        for line in self.journal().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    ev = json.loads(line)
                    if ev.get("event") == name:
                        out.append(ev)
        return out

    def wait_event(self, name: str, count: int = 1, timeout: float = 15) -> list[dict]:
        # journald takes the line from the unit's stdout stream on its own time: poll with a deadline
        return wait_until(lambda: (evs := self.events(name)) and len(evs) >= count and evs, timeout,
                          0.1, what=f"{count} x {name} in the journal")

    def processes(self) -> dict[int, dict[str, str]]:
        """The supervisor and its children: title, parent, and the /proc status fields the checks read."""
        script = r"""
import json, os, sys
main = int(sys.argv[1])
pids = [main] + [int(p) for p in open(f"/proc/{main}/task/{main}/children").read().split()]
out = {}
for pid in pids:
    status = dict(ln.split(":", 1) for ln in open(f"/proc/{pid}/status").read().splitlines() if ":" in ln)
    out[pid] = {k: status[k].strip() for k in ("PPid", "Uid", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs",
                                              "Seccomp", "Cpus_allowed_list")}
    out[pid]["title"] = open(f"/proc/{pid}/cmdline").read().replace("\0", " ").strip()
    out[pid]["mnt_ns"] = os.readlink(f"/proc/{pid}/ns/mnt")
print(json.dumps(out))
"""
        main = self.show("MainPID")["MainPID"]
        out = self.box.run("python3", "-c", script, main).stdout
        return {int(pid): info for pid, info in json.loads(out).items()}

    def workers(self) -> dict[int, dict[str, str]]:
        return {pid: p for pid, p in self.processes().items() if re.search(r": worker \d+", p["title"])}


def cpu_list(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def l4_roundtrip(sni: str) -> tuple[bytes, bytes]:
    """From loopback (internal): the reply and the certificate the client saw."""
    with tls_client(443, sni) as s:
        s.sendall(b"ping")
        return s.recv(65536), s.getpeercert(binary_form=True)


def l7_request(host, sni: str, raw: bytes) -> tuple[PQClient, bytes]:
    client = PQClient(host.connect(443), sni)
    try:
        client.handshake()
        return client, client.request(raw)
    finally:
        client.close()


def port_443_holder() -> str:
    """'' when nothing listens on the host's :443, else what ss says about the holder."""
    out = subprocess.run(["ss", "-Hltnp", "sport = :443"], capture_output=True, text=True).stdout
    return out.strip()


@pytest.fixture
def systemd_host(tmp_path):
    """The cached tree and wheelhouse, the machine-wide lock held, :443 free: or a skip that says why not."""
    if os.geteuid() != 0:
        pytest.skip("booting systemd in a container needs root (systemd-nspawn)")
    if shutil.which("systemd-nspawn") is None:  # ./dev installs it: a green run must not hide a missing step
        pytest.fail("systemd-nspawn is not installed (Debian: systemd-container)")
    log_path = tmp_path / "build.log"
    with open(log_path, "w") as log, debian_tree.locked():
        try:
            tree, built_s = debian_tree.ensure_tree(log)
            wheels = debian_tree.ensure_wheelhouse(tree, log, tmp_path / "wheel-build")
        except FileNotFoundError as exc:
            pytest.fail(str(exc))
        except debian_tree.BuildError as exc:
            log.flush()
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
            pytest.skip(f"cannot build the Debian tree or its wheels here: {exc}\n{tail}")
        if built_s is not None:
            print(f"built {tree} in {built_s:.0f} s")
        holder = port_443_holder()
        if holder:
            pytest.skip(f"the host's :443 is taken, the unit cannot bind it: {holder}")
        yield tree, wheels, log


def test_the_unit_serves_reloads_and_drains_under_systemd(
    systemd_host, tmp_path, redis_server, postgres_server, external_host  # noqa: F811
):
    tree, wheels, log = systemd_host
    platform = Platform(redis_server, postgres_server)
    pipe = TLSBackend("pipe", hostname("pipe"), str(tmp_path))
    web = HTTPBackend("web")
    platform.set_instance("pipe", "pipe-1", pipe.port)
    # a name, not an address: the worker resolves it off its loop (glibc, /etc/hosts) under the sandbox
    platform.set_instance("web", "web-1", web.port, tls=False, host="localhost")
    platform.add_app("pipe", "pipe")
    platform.add_app("web", "web")
    metrics = redis_server.client().pubsub()
    metrics.subscribe("stat:metrics")

    # The checkout the install block runs in: the wheel (its first block, done here), the unit files, the config
    checkout = tmp_path / "checkout"
    (checkout / "dist").mkdir(parents=True)
    shutil.copytree(debian_tree.REPO / "systemd", checkout / "systemd")
    shutil.copy(debian_tree.REPO / "README.md", checkout)
    shutil.copytree(debian_tree.REPO / "docs", checkout / "docs")
    wheel = debian_tree.build_wheel(wheels, tmp_path / "wheel", log)
    shutil.copy(wheel, checkout / "dist")
    mgmt_port = free_port()
    config = fleet_config(platform, mgmt_port)
    (checkout / "proxy.toml").write_text(config)
    subprocess.run(["sysctl", "-q", "-p", str(checkout / "systemd" / "99-sentin8-proxy.conf")], check=True)

    box = Container(tree, tmp_path / "boot", {str(checkout): CHECKOUT, str(wheels): WHEELHOUSE})
    unit = Unit(box)
    try:
        try:
            print(f"booted in {box.boot():.1f} s")
        except BootFailed as exc:
            pytest.skip(f"systemd-nspawn cannot boot systemd as PID 1 here: {exc}")
        # what every Debian install has and mmdebstrap leaves out; both families, so glibc sorts the answers
        box.run("sh", "-c", "cat > /etc/hosts", input="127.0.0.1 localhost\n::1 localhost ip6-localhost\n")
        t0 = time.monotonic()
        # pip reads the wheelhouse instead of PyPI: the block's commands are run as written
        done = box.run("sh", "-eux", check=False, timeout=600, input=f"cd {CHECKOUT}\n{SYSCTL_SHIM}{install_block()}",
                       env={"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": WHEELHOUSE})
        assert done.returncode == 0, f"the README's install block failed:\n{done.stderr[-3000:]}\n{unit.journal()}"
        print(f"installed and started in {time.monotonic() - t0:.1f} s")
        check_ready_and_sandboxed(unit, box)
        check_serving(unit, pipe, web, external_host, metrics, mgmt_port)
        check_reloads(unit, box, external_host, config)
        check_stop_drains(unit)
        check_taken_port_fails_without_a_restart_loop(unit)
        check_nothing_calls_a_denied_syscall(unit, box, external_host)
    finally:
        print(unit.journal()[-20000:] if box.pid1 else "")
        print(f"container halted: nspawn exit {box.poweroff()}")
        metrics.close()
        pipe.close()
        web.close()


def check_ready_and_sandboxed(unit: Unit, box: Container) -> None:
    """`systemctl enable --now` returned: Type=notify means READY=1 came, i.e. every worker listens."""
    state = unit.show("ActiveState", "SubState", "StatusText", "NRestarts", "Result")
    assert state["ActiveState"] == "active" and state["SubState"] == "running", state
    assert state["StatusText"] == "serving with 2 workers" and state["NRestarts"] == "0", state
    assert len(unit.wait_event("worker_listening", 2)) == 2 and unit.wait_event("ready")
    # the wheel's compiled hot path loads under the sandbox (MemoryDenyWriteExecute and all) and runs
    assert unit.wait_event("start")[0]["build"] == "compiled" and not unit.events("pure_python")
    resolver = unit.wait_event("resolver_start")[0]
    assert (resolver["registry"], resolver["domains"]) == ("valkey", "postgres")

    uid = box.run("id", "-u", UNIT).stdout.strip()
    pid1_mnt = box.run("readlink", "/proc/1/ns/mnt").stdout.strip()
    procs = unit.processes()
    supervisor = next(pid for pid, p in procs.items() if p["title"] == "sentin8-proxy: supervisor")
    allowed = cpu_list(procs[supervisor]["Cpus_allowed_list"])  # worker i is pinned to allowed[i mod n]
    assert sorted(p["title"] for p in procs.values()) == [
        "sentin8-proxy: mgmt", "sentin8-proxy: resolver", "sentin8-proxy: supervisor",
        *(f"sentin8-proxy: worker {i} [cpu {allowed[i % len(allowed)]}]" for i in range(2))], procs
    for pid, p in procs.items():
        # the sandbox is in force, not silently skipped by a systemd inside a container
        assert p["Uid"].split() == [uid] * 4, (pid, p)  # real, effective, saved, fs: never root
        assert int(p["CapEff"], 16) == int(p["CapBnd"], 16) == int(p["CapAmb"], 16) == CAP_NET_BIND_SERVICE, p
        assert p["NoNewPrivs"] == "1" and p["Seccomp"] == "2", p  # SystemCallFilter and friends: seccomp
        assert p["mnt_ns"] != pid1_mnt, p  # ProtectSystem, PrivateTmp, PrivateDevices...: its own mounts
    workers = unit.workers()
    assert len(workers) == 2 and all(int(p["PPid"]) == supervisor for p in workers.values())
    for pid, p in workers.items():
        index = int(re.search(r"worker (\d+)", p["title"])[1])
        cpu = allowed[index % len(allowed)]
        assert cpu_list(p["Cpus_allowed_list"]) == [cpu], p  # sched_setaffinity passed the syscall filter
        mask = box.run("taskset", "-p", str(pid)).stdout
        assert mask.strip().endswith(f"affinity mask: {1 << cpu:x}"), mask

    # :443 is held by the two workers (SO_REUSEPORT), as the service user: CAP_NET_BIND_SERVICE did it
    listeners = box.run("ss", "-Hltnpe", "sport = :443").stdout
    holders = {int(m) for m in re.findall(r"pid=(\d+)", listeners)}
    assert holders == set(workers), listeners
    assert re.findall(r"uid:(\d+)", listeners) == [uid] * 2, listeners
    assert box.run("cat", "/proc/sys/net/ipv4/tcp_migrate_req").stdout.strip() == "1"  # the sysctl drop-in


def check_serving(unit, pipe, web, external_host, metrics, mgmt_port) -> None:  # noqa: F811
    """Both paths, on routes that only Valkey (instances) and PostgreSQL (names) know."""
    reply, cert = l4_roundtrip(hostname("pipe"))
    assert reply == b"pipe:ping" and cert == pipe.cert_der  # spliced raw: the backend's own TLS and certificate
    client, resp = l7_request(external_host, hostname("web"),
                              b"GET /hello HTTP/1.1\r\nHost: %s\r\n\r\n" % hostname("web").encode())
    assert client.group_name == "X25519MLKEM768", client.group_name
    assert client.peer_cert.signature_algorithm_oid.dotted_string == "2.16.840.1.101.3.4.3.18"  # ML-DSA-65
    assert resp.startswith(b"HTTP/1.1 200 "), resp[:200]
    seen = json.loads(resp.partition(b"\r\n\r\n")[2])
    headers = {k.lower(): v for k, v in seen["headers"]}
    assert seen["backend"] == "web" and seen["path"] == "/hello"
    assert headers["x-forwarded-for"] == external_host.client_ip and headers["x-sentin8-service"] == "web"
    # the WAF (libmodsecurity through ctypes, a thread pool) runs under the syscall filter too
    attack = b"GET / HTTP/1.1\r\nHost: %s\r\nCookie: sid=1' or '1'='1\r\n\r\n" % hostname("web").encode()
    _, blocked = l7_request(external_host, hostname("web"), attack)
    assert blocked.startswith(b"HTTP/1.1 403 "), blocked[:200]
    assert [r["path"] for r in web.requests] == ["/hello"]

    # Valkey is written to as well as read: the resolver publishes stat:metrics every second
    def published():
        msg = metrics.get_message(timeout=1)
        return msg if msg and msg["type"] == "message" else None

    doc = json.loads(wait_until(published, 15, 0, what="a stat:metrics document from the fleet")["data"])
    assert doc["seq"] >= 1
    # the management API answers with the secret from /etc/sentin8-proxy/env (the EnvironmentFile)
    secret = unit.box.run("cat", "/etc/sentin8-proxy/env").stdout.strip().split("=", 1)[1]
    status, _, body = call(f"http://127.0.0.1:{mgmt_port}", "GET", "/stats", token(secret))
    assert status == 200, body
    fleet = json.loads(body)["fleet"]
    assert fleet["connections_l4"] >= 1 and fleet["connections_l7"] >= 2 and fleet["policy_waf"] == 1, fleet
    status, _, body = call(f"http://127.0.0.1:{mgmt_port}", "GET", "/health")
    health = json.loads(body)
    assert status == 200 and health["status"] == "ok" and health["mappings"] == 2, health
    # psutil reads each child's RSS under ProtectProc=invisible: the SIGUSR1 dump (supervisor only)
    unit.systemctl("kill", "--kill-who=main", "--signal=SIGUSR1", UNIT, check=True)
    line = wait_until(lambda: next((ln for ln in unit.journal().splitlines() if ln.startswith("stats ")), None),
                      10, 0.1, what="the stats line")
    rss = json.loads(line[len("stats "):])["rss_kib"]
    assert len(rss) == 4 and all(kib > 0 for kib in rss.values()), rss


def check_reloads(unit: Unit, box: Container, external_host, config: str) -> None:  # noqa: F811
    before = set(unit.workers())
    done = unit.systemctl("reload", UNIT)  # ExecReload: `sentin8-proxy reload --wait`
    assert done.returncode == 0, done.stderr + unit.journal()[-3000:]
    assert unit.wait_event("reload_done")[0]["seq"] == 1
    wait_until(lambda: re.search(r"sentin8-proxy reload: reload 1 done", unit.journal()), 10, 0.1,
               what="ExecReload's report in the journal")
    after = unit.workers()
    assert len(after) == 2 and not before & set(after), (before, after)  # replaced, one at a time
    assert all(len(cpu_list(p["Cpus_allowed_list"])) == 1 for p in after.values())  # and pinned again
    assert l4_roundtrip(hostname("pipe"))[0] == b"pipe:ping"
    assert l7_request(external_host, hostname("web"), b"GET /again HTTP/1.1\r\nHost: %s\r\n\r\n"
                      % hostname("web").encode())[1].startswith(b"HTTP/1.1 200 ")

    conf = "/etc/sentin8-proxy/proxy.toml"
    broken = {
        # not TOML: `reload` refuses it before it signals anyone
        "not TOML": (config + "\n[listen\n", r"not valid TOML"),
        # valid TOML naming a file that is not there: the supervisor refuses it (reload_refused)
        "a missing file": (config + '\n[tls]\nclient_ca_file = "/nonexistent/ca.pem"\n',
                           r"reload 2 refused: tls\.client_ca_file: cannot read /nonexistent/ca\.pem"),
    }
    for what, (text, said) in broken.items():
        box.run("sh", "-c", f"cat > {conf}", input=text)
        refused = unit.systemctl("reload", UNIT)
        assert refused.returncode != 0, f"systemctl reload accepted {what}"
        wait_until(lambda said=said: re.search(said, unit.journal()), 10, 0.1, what=f"'{said}' in the journal")
        state = unit.show("ActiveState", "SubState")
        assert state == {"ActiveState": "active", "SubState": "running"}, (what, state)
        assert set(unit.workers()) == set(after), what  # the running config keeps serving, untouched
        assert l4_roundtrip(hostname("pipe"))[0] == b"pipe:ping", what
    refusal = unit.wait_event("reload_refused")[0]
    assert refusal["reason"].startswith("tls.client_ca_file: "), refusal
    box.run("sh", "-c", f"cat > {conf}", input=config)


def check_stop_drains(unit: Unit) -> None:
    """`systemctl stop`: the supervisor alone gets SIGTERM (KillMode=mixed), workers drain, it exits 0."""
    held = tls_client(443, hostname("pipe"))
    held.sendall(b"before")
    assert held.recv(65536) == b"pipe:before"
    unit.systemctl("stop", "--no-block", UNIT, check=True)
    wait_until(lambda: unit.show("ActiveState")["ActiveState"] == "deactivating", 10, 0.05, what="deactivating")

    def refused() -> bool:  # the listeners are closed at once: new connections are refused...
        try:
            socket.create_connection(("127.0.0.1", 443), timeout=2).close()
        except ConnectionRefusedError:
            return True
        return False

    wait_until(refused, 10, 0.05, what=":443 closed by the draining workers")
    held.sendall(b"during")  # ...while the pipe already open is served to its end
    assert held.recv(65536) == b"pipe:during"
    assert unit.show("ActiveState")["ActiveState"] == "deactivating"
    closed_at = time.monotonic()
    held.close()
    wait_until(lambda: unit.show("ActiveState")["ActiveState"] == "inactive", DRAIN_S + 15, 0.05, what="stopped")
    took = time.monotonic() - closed_at
    assert took < DRAIN_S / 2, f"the stop took {took:.1f} s after the last connection: the drain timed out"
    state = unit.show("Result", "ExecMainCode", "ExecMainStatus")
    assert state == {"Result": "success", "ExecMainCode": "1", "ExecMainStatus": "0"}, state  # 1 = CLD_EXITED
    assert unit.wait_event("stopped")[0]["exit_code"] == 0
    assert not unit.events("child_died") and not unit.events("start_failures")  # nothing died on the way


def check_taken_port_fails_without_a_restart_loop(unit: Unit) -> None:
    """Exit 2 is a config the operator must fix: the unit fails once, with the key named, and stays failed."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the TIME_WAITs the tests left on :443
    holder.bind(("0.0.0.0", 443))
    holder.listen(1)
    try:
        assert unit.systemctl("start", UNIT).returncode != 0
        state = unit.show("ActiveState", "SubState", "Result", "ExecMainStatus", "NRestarts")
        # with a restart scheduled the unit would be "activating"/"auto-restart" now: RestartPreventExitStatus=2
        assert state == {"ActiveState": "failed", "SubState": "failed", "Result": "exit-code",
                         "ExecMainStatus": "2", "NRestarts": "0"}, state
        wait_until(lambda: re.search(r"listen\.https: cannot listen on 0\.0\.0\.0:443: already in use", unit.journal()),
                   10, 0.1, what="the key named in the journal")
    finally:
        holder.close()


KILL_ON_DENIED = """[Service]
# a syscall outside SystemCallFilter kills the process (SIGSYS) instead of failing with EPERM
SystemCallErrorNumber=
"""


def check_nothing_calls_a_denied_syscall(unit: Unit, box: Container, external_host) -> None:  # noqa: F811
    """EPERM (the unit's choice) can hide a call a library makes and copes with; killing the caller cannot: the
    same life again with a drop-in that makes a denied syscall fatal, and nothing dies."""
    assert unit.show("SystemCallErrorNumber")["SystemCallErrorNumber"] == "1"  # EPERM, as shipped
    box.run("sh", "-c", f"mkdir -p /etc/systemd/system/{UNIT}.service.d && "
            f"cat > /etc/systemd/system/{UNIT}.service.d/kill-on-denied-syscall.conf", input=KILL_ON_DENIED)
    unit.systemctl("daemon-reload", check=True)
    # systemd's "kill" marker (INT_MAX - 1), as `systemctl show` prints it
    assert unit.show("SystemCallErrorNumber")["SystemCallErrorNumber"] == str(2**31 - 2)
    since = box.run("date", "+%Y-%m-%d %H:%M:%S").stdout.strip()
    unit.systemctl("start", UNIT, check=True)
    assert l4_roundtrip(hostname("pipe"))[0] == b"pipe:ping"
    raw = b"GET /k HTTP/1.1\r\nHost: %s\r\n\r\n" % hostname("web").encode()
    assert l7_request(external_host, hostname("web"), raw)[1].startswith(b"HTTP/1.1 200 ")
    attack = raw.replace(b"\r\n\r\n", b"\r\nCookie: sid=1' or '1'='1\r\n\r\n")
    assert l7_request(external_host, hostname("web"), attack)[1].startswith(b"HTTP/1.1 403 ")
    assert unit.systemctl("reload", UNIT).returncode == 0
    unit.systemctl("kill", "--kill-who=main", "--signal=SIGUSR1", UNIT, check=True)
    unit.systemctl("stop", UNIT, check=True)
    state = unit.show("Result", "ExecMainCode", "ExecMainStatus")
    assert state == {"Result": "success", "ExecMainCode": "1", "ExecMainStatus": "0"}, state
    journal = box.run("journalctl", "--no-pager", "-o", "cat", "-u", UNIT, "--since", since).stdout
    assert '"event":"reload_done"' in journal and "\nstats " in journal, journal[-3000:]
    assert '"event":"child_died"' not in journal and "SIGSYS" not in journal, journal[-3000:]
