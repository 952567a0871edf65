"""``sentin8-proxy demo``: the fleet on unprivileged ports with file sources and a demo TLS backend.

The demo backend terminates its own TLS (as platform services do), so an internal client (loopback) reaches
it through the proxy's L4 path and sees the backend's own certificate: the proxy never decrypts.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import signal
import socket
import ssl
import sys
import tempfile

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sentin8.config import Mgmt, load_file
from sentin8.mgmt.auth import mint
from sentin8.mgmt.credentials import ALL_SCOPES, new_secret

DEMO_HOST = "demo.sentin8.test"
DEMO_TOKEN_TTL_S = 12 * 3600


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


async def _demo_backend(sock: socket.socket, cert: str, key: str) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                echoed = "\n".join(line for line in lines[1:] if line)
                body = f"hello from the demo backend\nyou sent: {lines[0]}\n{echoed}\n".encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n" % len(body))
                writer.write(body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, sock=sock, ssl=ctx)
    async with server:
        await server.serve_forever()


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
    backend = socket.socket()
    backend.bind(("127.0.0.1", 0))
    backend.listen(128)
    backend_port = backend.getsockname()[1]
    https_port = _free_port_or(https_port)
    mgmt_port = _free_port_or(9180, "127.0.0.1")
    mgmt_cfg = Mgmt()
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

[tls]
cert_dir = "{workdir}/certs"
state_dir = "{workdir}"

[[instances]]
service = "demo"
id = "demo-1"
host = "127.0.0.1"
port = {backend_port}
tls = true

[[domains]]
hostname = "{DEMO_HOST}"
service = "demo"
env_id = "env-demo"
app_id = "app-demo"
"""
        )
    pid = os.fork()
    if pid == 0:
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor's Ctrl-C drains; we die with it
            asyncio.run(_demo_backend(backend, cert, key))
        finally:
            os._exit(0)
    backend.close()
    print(
        f"""
Sentin8:Proxy demo
  config:   {config_path}  (file sources; edit it and the resolver picks it up, or send SIGHUP)
  backend:  demo TLS backend on 127.0.0.1:{backend_port} (its own certificate, CN={DEMO_HOST})
  reach it through the proxy's L4 path (loopback is internal: the proxy routes by SNI, never decrypts):

    curl --resolve {DEMO_HOST}:{https_port}:127.0.0.1 -k https://{DEMO_HOST}:{https_port}/

  an unknown name is closed (fail closed):
    curl --resolve nope.example:{https_port}:127.0.0.1 -k https://nope.example:{https_port}/
  management API and dashboard (token valid {DEMO_TOKEN_TTL_S // 3600} h, every scope; paste it into the page):
    http://127.0.0.1:{mgmt_port}/
    {token}
  the CLI on this box mints a fresh token per command from the demo's secret (a change is one-use per token):
    export {mgmt_cfg.jwt_secret_env}={secret} SENTIN8_MGMT_URL=http://127.0.0.1:{mgmt_port}
    sentin8-proxy status; sentin8-proxy backends; sentin8-proxy policy --set rate_limit=true rate_limit_rps=5
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
