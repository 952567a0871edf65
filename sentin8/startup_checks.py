"""What ``sentin8.config`` cannot see from the text alone: the files, directories and URLs it names.

``check_paths`` runs in ``check-config``, at ``run`` before anything binds, and at every reload before a
worker is replaced, so a missing CA file or a malformed Valkey URL is one ``key: reason`` line and exit 2
(or a refused reload), never a worker restart loop or a resolver that crashes behind a READY fleet.
Certificates, keys and CA files are loaded the way the data path loads them (``sentin8.tls``'s own context
builders, the same OpenSSL calls): a file that looks like PEM but does not load is refused here, not by
every worker at start or by every request to a TLS backend.
Kept apart from ``config.load_bytes`` on purpose: a config is also built in tests and tools on machines
that do not have its files.
"""

from __future__ import annotations

import os
from urllib.parse import urlparse

from .config import Config, ConfigError


def _readable_file(key: str, path: str, pem_marker: str | None = None) -> None:
    if not path:
        return
    try:
        with open(path, "rb") as fh:
            head = fh.read(1 << 20)
    except IsADirectoryError:
        raise ConfigError(f"{key}: {path} is a directory, not a file") from None
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path} ({exc.strerror})") from None
    if pem_marker is not None and f"-----BEGIN {pem_marker}".encode() not in head:
        raise ConfigError(f"{key}: {path} holds no PEM {pem_marker.lower()}")


def _tls_files(cfg: Config) -> None:
    """Build the contexts the workers will build, from the same files: the server context that asks for
    client certificates, and the upstream context (CA, client certificate and key)."""
    from . import tls

    if cfg.tls.client_ca_file:
        try:
            tls.server_context(client_ca_file=cfg.tls.client_ca_file)
        except tls.TLSSetupError as exc:
            raise ConfigError(f"tls.client_ca_file: {cfg.tls.client_ca_file} does not load ({exc.reason})") from None
    up = cfg.upstream
    if up.ca_file or up.client_cert:
        try:
            tls.upstream_context(ca_file=up.ca_file, client_cert=up.client_cert, client_key=up.client_key)
        except tls.TLSSetupError as exc:
            field = exc.field or "ca_file"
            path = {"ca_file": up.ca_file, "client_cert": up.client_cert}.get(field, up.client_key or up.client_cert)
            raise ConfigError(f"upstream.{field}: {path} does not load ({exc.reason})") from None


def _writable_dir(key: str, path: str) -> None:
    """The directory exists (or can be created, as the proxy would) and the proxy can write into it."""
    if not path:
        raise ConfigError(f"{key}: must not be empty")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{key}: {path} is not a directory")
    if not os.path.isdir(path):
        try:
            os.makedirs(path, mode=0o750, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"{key}: cannot create {path} ({exc.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}: {path} is not writable by uid {os.geteuid()}")


def _readable_dir(key: str, path: str) -> None:
    """A directory the proxy only reads (certbot writes it): it may be missing (nothing issued yet), but
    what is there must be a directory the proxy can list."""
    if not path:
        raise ConfigError(f"{key}: must not be empty")
    if not os.path.exists(path):
        return
    if not os.path.isdir(path):
        raise ConfigError(f"{key}: {path} is not a directory")
    if not os.access(path, os.R_OK | os.X_OK):
        raise ConfigError(f"{key}: {path} is not readable by uid {os.geteuid()}")


def _valkey_url(key: str, url: str) -> None:
    from redis.connection import parse_url

    try:
        parsed = parse_url(url)
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    if "path" not in parsed and not parsed.get("host"):
        raise ConfigError(f"{key}: {url!r} names no host")
    # redis-py reads a database path that is not a number as database 0, silently: refuse it instead
    path = urlparse(url).path.strip("/") if "path" not in parsed else ""
    if path and not path.isdigit():
        raise ConfigError(f"{key}: database {path!r} in {url!r} is not a number (redis://host:port/N)")


def _postgres_dsn(key: str, dsn: str) -> None:
    from psycopg import ProgrammingError, conninfo

    try:
        parts = conninfo.conninfo_to_dict(dsn)
    except ProgrammingError as exc:
        raise ConfigError(f"{key}: {str(exc).strip()}") from None
    port = str(parts.get("port") or "5432")
    if not all(p.isdigit() and 0 < int(p) < 65536 for p in port.split(",")):
        raise ConfigError(f"{key}: port {port!r} is not a port number")


def check_paths(cfg: Config) -> None:
    """Raise ConfigError (``key: reason``) for the first file, directory or URL the fleet could not use."""
    _readable_file("tls.client_ca_file", cfg.tls.client_ca_file, "CERTIFICATE")
    _readable_file("upstream.ca_file", cfg.upstream.ca_file, "CERTIFICATE")
    _readable_file("upstream.client_cert", cfg.upstream.client_cert, "CERTIFICATE")
    _readable_file("upstream.client_key", cfg.upstream.client_key, "")
    _tls_files(cfg)
    _writable_dir("tls.state_dir", cfg.tls.state_dir)
    _readable_dir("tls.cert_dir", cfg.tls.cert_dir)
    src = cfg.sources
    if src.registry == "valkey" or src.domains == "postgres":  # Postgres domain events come over Valkey too
        _valkey_url("sources.valkey_url", src.valkey_url)
    if cfg.metrics.valkey_url:
        _valkey_url("metrics.valkey_url", cfg.metrics.valkey_url)
    if src.domains == "postgres":
        _postgres_dsn("sources.postgres_dsn", src.postgres_dsn)
