"""``sentin8-proxy demo``: the fleet on unprivileged ports with file sources, one name per path.

- ``demo.sentin8.test``, the L4 path: the demo backend terminates its own TLS (as platform services do), so an
  internal client (``127.0.0.1``) reaches it through the proxy's SNI-routed pipe and sees the backend's own
  certificate: the proxy never decrypts.
- ``app.sentin8.test``, the L7 edge: ``127.0.0.2`` (any loopback address works without privileges) is left
  out of the demo's ``network.internal_cidrs``, so a client connecting *from* it is external: PQ TLS
  terminated with the demo's ML-DSA-65 certificate, header hygiene, the WAF (when a CRS is on this machine)
  and a rate limit, then plain HTTP to an echo backend that answers with what it received, so the injected
  ``X-Sentin8-*`` context is visible. Stock ``curl`` cannot speak that TLS: ``sentin8-proxy probe`` does.

The banner lists each command to try as a ``  $ `` line (tests/test_demo.py runs every one).
"""

from __future__ import annotations

import asyncio
import datetime
import os
import shlex
import shutil
import signal
import socket
import ssl
import sys
import tempfile
import time

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sentin8.certpair import self_signed_mldsa65, write_pair
from sentin8.certstore import store_dirname
from sentin8.config import Mgmt, Policy, load_file
from sentin8.mgmt.auth import mint
from sentin8.mgmt.credentials import ALL_SCOPES, new_secret

DEMO_HOST = "demo.sentin8.test"  # the L4 path
APP_HOST = "app.sentin8.test"  # the L7 edge
EXTERNAL_ADDR = "127.0.0.2"  # the demo's "Internet": outside its internal_cidrs
DEMO_TOKEN_TTL_S = 12 * 3600
RATE_RPS, RATE_BURST = 5, 10  # per client address, on the L7 edge (L4 is never limited)
WAF_ATTACK_PATH = "/?q=%3Cscript%3Ealert(1)%3C/script%3E"  # CRS 941100 (XSS) at paranoia 1


def write_demo_cert(directory: str, hostname: str) -> tuple[str, str]:
    """A classical self-signed cert: the demo backend is reached by stock curl on Debian 12 (OpenSSL 3.0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(hostname)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = os.path.join(directory, "backend.crt"), os.path.join(directory, "backend.key")
    with open(cert_path, "wb") as fh:
        fh.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as fh:
        fh.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    return cert_path, key_path


def _echo(head: bytes, body: bytes, tls: bool) -> bytes:
    lines = head.decode("latin-1").split("\r\n")
    echoed = "\n".join(line for line in lines[1:] if line)
    kind = "its own TLS, reached through the L4 pipe" if tls else "plain HTTP, behind the L7 edge"
    text = f"hello from the demo backend ({kind})\nyou sent: {lines[0]}\n{echoed}\n"
    if body:
        text += f"\nand a body of {len(body)} bytes:\n{body.decode('utf-8', 'replace')}\n"
    return text.encode()


async def _demo_backend(tls_sock: socket.socket, http_sock: socket.socket, cert: str, key: str) -> None:
    """Two listeners: TLS (the L4 name's service) and plain HTTP (the L7 name's); both echo the request."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)

    def handler(tls: bool):
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    fields = head.lower().split(b"\r\n")
                    length = next((int(f[15:]) for f in fields if f.startswith(b"content-length:")), 0)
                    chunked = any(f.startswith(b"transfer-encoding:") for f in fields)
                    body = await reader.readexactly(min(length, 1 << 20)) if length else b""
                    text = _echo(head, body, tls)
                    close = b"connection: close\r\n" if chunked else b""  # a chunked body is not read: stop here
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\n%scontent-length: %d"
                                 b"\r\n\r\n" % (close, len(text)) + text)  # fmt: skip
                    await writer.drain()
                    if close:
                        break
            except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, asyncio.LimitOverrunError, ValueError):
                pass
            finally:
                writer.close()

        return handle

    tls_server = await asyncio.start_server(handler(True), sock=tls_sock, ssl=ctx)
    http_server = await asyncio.start_server(handler(False), sock=http_sock)
    async with tls_server, http_server:
        await asyncio.gather(tls_server.serve_forever(), http_server.serve_forever())


def _waf_setting() -> tuple[bool, str]:
    """WAF on when this machine has a CRS that loads (Debian's modsecurity-crs, or a v4 at the default path)."""
    from sentin8.waf import check_policy

    policy = Policy(waf=True)
    if not os.path.isdir(policy.waf_crs_dir):
        return False, f"off: no OWASP CRS at {policy.waf_crs_dir} (apt install modsecurity-crs)"
    problem = check_policy(policy)
    if problem is not None:
        return False, f"off: {problem}"
    return True, f"on (OWASP CRS from {policy.waf_crs_dir}, paranoia 1)"


def _cli() -> str:
    """How to call this CLI from the operator's shell, as the printed commands must work when pasted."""
    found = shutil.which("sentin8-proxy")
    if found and os.path.realpath(found) == os.path.realpath(sys.argv[0]):
        return "sentin8-proxy"
    if os.path.basename(sys.argv[0]) == "sentin8-proxy":
        return os.path.abspath(sys.argv[0])
    return f"{sys.executable} -m supervisor.cli"


def _free_port_or(preferred: int, host: str = "0.0.0.0") -> int:
    with socket.socket() as s:
        try:
            s.bind((host, preferred))
            return preferred
        except OSError:
            s.bind(("0.0.0.0", 0))
            return s.getsockname()[1]


def run_demo(https_port: int, workers: int) -> int:
    from .arbiter import run

    workdir = tempfile.mkdtemp(prefix="sentin8-demo-")
    cert, key = write_demo_cert(workdir, DEMO_HOST)
    app_cert, app_key = self_signed_mldsa65([APP_HOST], time.time() - 300, time.time() + 7 * 86400)
    app_dir = os.path.join(workdir, "certs", store_dirname(APP_HOST))
    write_pair(app_dir, [app_cert], app_key)
    backend = socket.socket()
    backend.bind(("127.0.0.1", 0))
    backend.listen(128)
    backend_port = backend.getsockname()[1]
    echo = socket.socket()
    echo.bind(("127.0.0.1", 0))
    echo.listen(128)
    echo_port = echo.getsockname()[1]
    https_port = _free_port_or(https_port)
    mgmt_port = _free_port_or(9180, "127.0.0.1")
    mgmt_cfg = Mgmt()
    waf, waf_note = _waf_setting()
    # the demo's own signing secret (kept if the operator exported one), and a token to try the API with
    secret = os.environ.get(mgmt_cfg.jwt_secret_env) or new_secret()
    os.environ[mgmt_cfg.jwt_secret_env] = secret
    token = mint(secret.encode(), mgmt_cfg, list(ALL_SCOPES), DEMO_TOKEN_TTL_S, sub="demo")
    config_path = os.path.join(workdir, "sentin8-demo.toml")
    with open(config_path, "w") as fh:
        fh.write(
            f"""# written by `sentin8-proxy demo`
[listen]
https = "0.0.0.0:{https_port}"
http = ""
mgmt = "127.0.0.1:{mgmt_port}"

[fleet]
workers = {workers}
drain_timeout_s = 5

[network]
# 127.0.0.1 is internal (the L4 path); every other source, {EXTERNAL_ADDR} included, is external (the L7 edge)
internal_cidrs = ["127.0.0.1/32", "::1/128"]

[policy]
waf = {"true" if waf else "false"}
rate_limit = true
rate_limit_rps = {RATE_RPS}
rate_limit_burst = {RATE_BURST}

[tls]
cert_dir = "{workdir}/certs"
state_dir = "{workdir}"

[[instances]]
service = "demo"
id = "demo-1"
host = "127.0.0.1"
port = {backend_port}
tls = true

[[instances]]
service = "app"
id = "app-1"
host = "127.0.0.1"
port = {echo_port}

[[domains]]
hostname = "{DEMO_HOST}"
service = "demo"
env_id = "env-demo"
app_id = "app-demo"

[[domains]]
hostname = "{APP_HOST}"
service = "app"
env_id = "env-demo"
app_id = "app-shop"
org_id = "org-demo"
"""
        )
    pid = os.fork()
    if pid == 0:
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor's Ctrl-C drains; we die with it
            asyncio.run(_demo_backend(backend, echo, cert, key))
        finally:
            os._exit(0)
    backend.close()
    echo.close()
    cli = _cli()
    app_url = f"https://{APP_HOST}:{https_port}"
    probe = (f"{cli} probe --source {EXTERNAL_ADDR} --resolve {APP_HOST}:{https_port}:{EXTERNAL_ADDR} "
             f"--cafile {shlex.quote(os.path.join(app_dir, 'fullchain.pem'))}")  # fmt: skip
    waf_lines = (
        f"""  a request the WAF blocks (403):
  $ {probe} {shlex.quote(app_url + WAF_ATTACK_PATH)}
"""
        if waf
        else ""
    )
    print(
        f"""
Sentin8:Proxy demo
  config:   {config_path}  (file sources; edit it and the resolver picks it up, or send SIGHUP)
  L4:       {DEMO_HOST} -> demo TLS backend on 127.0.0.1:{backend_port} (its own certificate, CN={DEMO_HOST})
  L7:       {APP_HOST} -> echo backend on 127.0.0.1:{echo_port} (plain HTTP), behind the PQ edge
  WAF {waf_note}; rate limit {RATE_RPS}/s, burst {RATE_BURST}, per client address (L7 only)

  the L4 path (127.0.0.1 is internal: the proxy routes on the SNI and pipes the bytes, never decrypts):
  $ curl --resolve {DEMO_HOST}:{https_port}:127.0.0.1 -k https://{DEMO_HOST}:{https_port}/

  the L7 edge ({EXTERNAL_ADDR} plays an external client; stock curl cannot speak X25519MLKEM768 + ML-DSA-65,
  the probe runs on the proxy's own OpenSSL; the backend echoes what it received, X-Sentin8-* context included):
  $ {probe} {app_url}/
{waf_lines}  over the rate limit (429 once the burst is spent):
  $ {probe} --repeat {RATE_BURST * 2} {app_url}/
  an unknown name is closed (fail closed):
  $ curl --resolve nope.example:{https_port}:127.0.0.1 -k https://nope.example:{https_port}/

  management API and dashboard (token valid {DEMO_TOKEN_TTL_S // 3600} h, every scope; paste it into the page):
    http://127.0.0.1:{mgmt_port}/
    {token}
  the CLI on this box mints a fresh token per command from the demo's secret (a change is one-use per token):
    export {mgmt_cfg.jwt_secret_env}={secret} SENTIN8_MGMT_URL=http://127.0.0.1:{mgmt_port}
    {cli} status; {cli} backends; {cli} policy --set rate_limit_rps=50
  Ctrl-C drains and stops.
""",
        flush=True,
    )
    try:
        return run(config_path, load_file(config_path))
    finally:
        try:
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass  # the supervisor's reaper may have collected it already
        sys.stdout.flush()
