"""The peers doing the same job: sentin8, nginx, HAProxy (default and forced splice), and the backends.

Every peer gets the same routes:

- L4 (TLS passthrough, routed on the ClientHello's SNI): ``bulk``/``rate``/``sink``/``ws`` ``.bench.test`` go
  to the Python backends of ``bench.backends``; ``bench.test`` to the backend nginx's own TLS server.
- L7 (PQ TLS terminated at the peer, HTTP/1.1 to the backend): ``/`` to the backend nginx's plain HTTP server
  (small fixed body), ``/ws`` on ``ws.bench.test`` to the plain WebSocket echo backend.

Pinning: the backend nginx (one worker) and the Python backends share CPU 1; each proxy runs two workers
(HAProxy: two threads of one process, it has no multi-process mode since 2.5), worker i pinned to CPU i
(sentin8 pins its own workers the same way). Clients are not pinned.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import procs
from bench.certs import CertFiles
from bench.toolchain import Toolchain

BODY = b"sentin8 bench: a small fixed body served by the backend nginx.\n"  # 63 bytes
L4_NAMES = ("bulk", "rate", "sink", "ws")
BACKEND_CPU = 1
WORKERS = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 15.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited {proc.returncode} before listening on {port}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing listens on {port} after {timeout}s")
        time.sleep(0.05)


@dataclass
class Routes:
    """Where each route's backend listens."""

    l4: dict[str, int]  # L4 name ("bulk", ...) -> Python backend port
    backend_http: int  # backend nginx, plain HTTP
    backend_tls: int  # backend nginx, PQ TLS (the L7 direct path, and bench.test over L4)
    ws_plain: int  # WebSocket echo, plain (behind L7 terminators; the L7 WebSocket floor)
    ws_tls: int  # WebSocket echo terminating PQ TLS itself (behind L4; the L4 WebSocket floor)


@dataclass
class Peer:
    name: str
    l4_port: int | None = None
    l7_port: int | None = None
    proc: subprocess.Popen | None = None
    log: Path | None = None
    fleet: object = None  # tests.peers.Fleet for sentin8
    note: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def root_pid(self) -> int:
        return self.fleet.proc.pid if self.fleet is not None else self.proc.pid

    def pids(self) -> list[int]:
        """Every process of the peer: its CPU time is the peer's cost."""
        return procs.tree(self.root_pid)

    def worker_pids(self) -> list[int]:
        """The processes that hold connections (for RSS): workers, not masters or supervisors."""
        if self.fleet is not None:
            return list(self.fleet.workers())
        kids = procs.children(self.root_pid)
        return kids or [self.root_pid]  # HAProxy: one process, its threads are the workers

    def stop(self) -> None:
        if self.fleet is not None:
            self.fleet.stop()
            return
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, n: int = 5) -> str:
        if self.fleet is not None:
            return "\n".join(self.fleet.output().splitlines()[-n:])
        if self.log and self.log.exists():
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        return ""


def _popen(tc: Toolchain, argv: list[str], log: Path) -> subprocess.Popen:
    fh = open(log, "w")  # noqa: SIM115 - handed to the child; closed with our copy right after
    try:
        return tc.popen(argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        fh.close()


# ---- nginx -------------------------------------------------------------------------------------------------


def _nginx_common(work: Path, name: str, workers: int, affinity: str, nofile: int) -> str:
    tmp = work / f"{name}-tmp"
    tmp.mkdir(exist_ok=True)
    return f"""
load_module /usr/lib/nginx/modules/ngx_stream_module.so;
user root;
daemon off;
master_process on;
worker_processes {workers};
worker_cpu_affinity {affinity};
worker_rlimit_nofile {nofile};
pid {work}/{name}.pid;
error_log {work}/{name}.error.log warn;
events {{ worker_connections {nofile - 100}; }}
"""


def _tls_lines(cert: CertFiles) -> str:
    return f"""
        ssl_certificate {cert.cert};
        ssl_certificate_key {cert.key};
        ssl_protocols TLSv1.3;
        ssl_ecdh_curve X25519MLKEM768;
"""


def _http_common(work: Path, name: str) -> str:
    tmp = work / f"{name}-tmp"
    return f"""
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    keepalive_requests 100000000;
    keepalive_timeout 600s;
"""


def start_backend_nginx(tc: Toolchain, work: Path, cert: CertFiles, nofile: int) -> Peer:
    """The one backend: a small fixed body over plain HTTP and over PQ TLS, one worker on CPU 1."""
    http_port, tls_port = free_port(), free_port()
    affinity = "1" + "0" * BACKEND_CPU  # bit mask: CPU 1 only
    conf = work / "backend-nginx.conf"
    body = BODY.decode().replace("\n", "\\n")
    conf.write_text(
        _nginx_common(work, "backend", 1, affinity, nofile)
        + f"""
http {{
{_http_common(work, "backend")}
    server {{
        listen 127.0.0.1:{http_port} backlog=4096;
        location / {{ default_type text/plain; return 200 "{body}"; }}
    }}
    server {{
        listen 127.0.0.1:{tls_port} ssl backlog=4096;
        http2 on;  # the direct path of the h2 scenarios
{_tls_lines(cert)}
        location / {{ default_type text/plain; return 200 "{body}"; }}
    }}
}}
"""
    )
    log = work / "backend-nginx.log"
    proc = _popen(tc, ["nginx", "-c", str(conf)], log)
    wait_port(http_port, proc=proc)
    wait_port(tls_port, proc=proc)
    return Peer("backend", proc=proc, log=log, extra={"http": http_port, "tls": tls_port})


def start_nginx(tc: Toolchain, work: Path, cert: CertFiles, routes: Routes, nofile: int) -> Peer:
    l4, l7 = free_port(), free_port()
    conf = work / "nginx.conf"
    sni_map = "\n".join(f"        {n}.bench.test 127.0.0.1:{p};" for n, p in routes.l4.items())
    conf.write_text(
        _nginx_common(work, "nginx", WORKERS, "01 10", nofile)
        + f"""
stream {{
    map $ssl_preread_server_name $l4_backend {{
{sni_map}
        bench.test 127.0.0.1:{routes.backend_tls};
    }}
    server {{
        listen 127.0.0.1:{l4} backlog=4096 reuseport;
        ssl_preread on;
        preread_timeout 10s;
        proxy_pass $l4_backend;
        proxy_timeout 600s;
    }}
}}
http {{
{_http_common(work, "nginx")}
    map $http_upgrade $connection_upgrade {{ default upgrade; '' ''; }}
    upstream backend {{ server 127.0.0.1:{routes.backend_http}; keepalive 128; }}
    upstream wsecho {{ server 127.0.0.1:{routes.ws_plain}; }}
    server {{
        listen 127.0.0.1:{l7} ssl backlog=4096 reuseport;
        http2 on;  # ALPN h2 for the h2 scenarios; the --h1 ones still negotiate http/1.1
{_tls_lines(cert)}
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
        location /ws {{
            proxy_pass http://wsecho;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""
    )
    log = work / "nginx.log"
    proc = _popen(tc, ["nginx", "-c", str(conf)], log)
    wait_port(l4, proc=proc)
    wait_port(l7, proc=proc)
    return Peer("nginx", l4_port=l4, l7_port=l7, proc=proc, log=log, note="2 workers, worker_cpu_affinity 01 10")


# ---- HAProxy -----------------------------------------------------------------------------------------------


HAPROXY_MAXPIPES = 256  # splice pipes (2 fds each) held only by connections moving data: 32 bulk ones at most


def haproxy_maxconn(splice: bool = True) -> int:
    """HAProxy's one process wants 2 fds per connection (+ 2 per splice pipe) and refuses to start above
    RLIMIT_NOFILE; with ``splice`` the answer holds for both variants."""
    import resource

    pipes = 2 * HAPROXY_MAXPIPES if splice else 0
    return min(50_000, (resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 40 - pipes) // 2)


def start_haproxy(tc: Toolchain, work: Path, cert: CertFiles, routes: Routes, splice: bool) -> Peer:
    """``splice`` forces splice(2) both ways (option splice-request/-response) on the L4 path."""
    maxconn = haproxy_maxconn(splice)
    l4, l7 = free_port(), free_port()
    name = "haproxy-splice" if splice else "haproxy"
    opt = "    option splice-request\n    option splice-response\n" if splice else ""
    l4_backends = dict(routes.l4)
    l4_backends["main"] = routes.backend_tls
    use = (
        "\n".join(f"    use_backend t_{n} if {{ req.ssl_sni -i {n}.bench.test }}" for n in routes.l4)
        + "\n    use_backend t_main if { req.ssl_sni -i bench.test }"
    )
    backends = "\n".join(
        f"backend t_{n}\n    mode tcp\n{opt}    server s1 127.0.0.1:{p}\n" for n, p in l4_backends.items()
    )
    conf = work / f"{name}.cfg"
    conf.write_text(
        f"""
global
    nbthread {WORKERS}
    cpu-map 1/1 0
    cpu-map 1/2 1
    maxconn {maxconn}
    maxpipes {HAPROXY_MAXPIPES if splice else 0}
    ssl-default-bind-options ssl-min-ver TLSv1.3
    pidfile {work}/{name}.pid

defaults
    timeout connect 5s
    timeout client 600s
    timeout server 600s
    timeout http-keep-alive 600s
    timeout http-request 15s
    timeout tunnel 600s
    maxconn {maxconn}

frontend l4
    mode tcp
    bind 127.0.0.1:{l4} backlog 4096
{opt}    tcp-request inspect-delay 10s
    tcp-request content accept if {{ req.ssl_hello_type 1 }}
{use}

{backends}
frontend l7
    mode http
    bind 127.0.0.1:{l7} backlog 4096 ssl crt {cert.combined} curves X25519MLKEM768 ssl-min-ver TLSv1.3 alpn h2,http/1.1
    use_backend h_ws if {{ path_beg /ws }}
    default_backend h_web

backend h_web
    mode http
    http-reuse always
    server s1 127.0.0.1:{routes.backend_http} maxconn 1000

backend h_ws
    mode http
    server s1 127.0.0.1:{routes.ws_plain}
"""
    )
    log = work / f"{name}.log"
    proc = _popen(tc, ["haproxy", "-db", "-f", str(conf)], log)
    wait_port(l4, proc=proc)
    wait_port(l7, proc=proc)
    note = "1 process, 2 threads, cpu-map 1/1 0 and 1/2 1" + (", option splice-request/-response" if splice else "")
    return Peer(name, l4_port=l4, l7_port=l7 if not splice else None, proc=proc, log=log, note=note)


# ---- sentin8 -----------------------------------------------------------------------------------------------


def start_sentin8(work: Path, cert: CertFiles, routes: Routes) -> Peer:
    """Two fleets: loopback is internal in the first (L4 pipe), external in the second (L7 termination)."""
    from tests.peers import Fleet  # the way the tests start the real ``sentin8-proxy run``

    l4_body = "".join(
        f'[[instances]]\nservice = "{n}"\nid = "{n}-1"\nhost = "127.0.0.1"\nport = {p}\n'
        f'[[domains]]\nhostname = "{n}.bench.test"\nservice = "{n}"\n'
        for n, p in [*routes.l4.items(), ("main", routes.backend_tls)]
    ).replace('hostname = "main.bench.test"', 'hostname = "bench.test"')
    l7_body = (
        f'[[instances]]\nservice = "web"\nid = "web-1"\nhost = "127.0.0.1"\nport = {routes.backend_http}\n'
        f'[[instances]]\nservice = "ws"\nid = "ws-1"\nhost = "127.0.0.1"\nport = {routes.ws_plain}\n'
        '[[domains]]\nhostname = "bench.test"\nservice = "web"\n'
        '[[domains]]\nhostname = "ws.bench.test"\nservice = "ws"\n'
    )
    fleets = {}
    for kind, body, extra in (
        ("l4", l4_body, ""),
        # loopback must count as external for the L7 path: leave 127.0.0.0/8 out of internal_cidrs
        # nginx's keepalive_requests is raised for the bench (it caps h2 streams per connection too): so is ours
        (
            "l7",
            l7_body,
            '[network]\ninternal_cidrs = ["10.0.0.0/8"]\n[http2]\nmax_streams_per_connection = 100000000\n',
        ),
    ):
        d = work / f"sentin8-{kind}"
        if d.exists():
            shutil.rmtree(d)
        d.mkdir()
        for host in ("bench.test", "ws.bench.test"):
            cdir = d / "certs" / host
            cdir.mkdir(parents=True)
            shutil.copy(cert.cert, cdir / "fullchain.pem")
            shutil.copy(cert.key, cdir / "privkey.pem")
        fleets[kind] = Fleet(str(d), body, workers=WORKERS, extra=extra)
    note = "2 workers, pinned by sentin8 (worker i on CPU i)"
    return Peer(
        "sentin8",
        l4_port=fleets["l4"].port,
        fleet=fleets["l4"],
        note=note,
        extra={"l7": Peer("sentin8", l7_port=fleets["l7"].port, fleet=fleets["l7"], note=note)},
    )


def rlimit_nofile(want: int = 262_144) -> int:
    """Raise our (and so our children's) open-file limit: 10,000 idle connections need 20,000+ fds in a proxy.

    Without CAP_SYS_RESOURCE (containers) only the soft limit can move, up to the hard one."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = max(soft, want)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, max(hard, target)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def environment_pins() -> str:
    return (
        f"backends on CPU {BACKEND_CPU} (backend nginx: 1 worker; Python backends: 1 process each); "
        f"proxies: {WORKERS} workers, worker i on CPU i; clients unpinned"
    )
