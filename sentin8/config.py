"""Operator configuration: TOML decoded by msgspec into typed structs, then checked.

Every error names the key (``listen.https``) and the reason, so an operator can fix a file from one line.
The key names are public (ARCHITECTURE.md §7): add keys freely, rename none.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import tomllib
from typing import Literal

import msgspec


class ConfigError(Exception):
    """A configuration problem, already phrased as ``key: reason``."""


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class Listen(_Section):
    https: str = "0.0.0.0:443"
    http: str = "0.0.0.0:80"
    mgmt: str = "127.0.0.1:9180"
    internal_l4: str = ""  # guaranteed-L4 listener: every connection SNI-routed and piped raw; "" = off


class Fleet(_Section):
    workers: int = 0
    drain_timeout_s: float = 30
    # A draining worker keeps idle keep-alive connections this long, answering their next request with
    # Connection: close (HAProxy's idle-close-on-response), then closes those still idle.
    drain_idle_grace_s: float = 2
    restart_backoff_max_s: float = 30
    rss_limit_mb: int = 0  # 0 = only report RSS; > 0 = recycle a worker above it


class Limits(_Section):
    peek_timeout_s: float = 10
    # 32 KiB: a ClientHello in one maximal record (16,389 bytes on the wire) and the same hello split over
    # several records; a larger hello is refused with illegal_parameter (sentin8/clienthello.py)
    peek_max_bytes: int = 32768
    handshake_timeout_s: float = 10
    header_timeout_s: float = 15
    idle_timeout_s: float = 60
    max_connections_per_ip: int = 0  # concurrent connections per client address, all workers; 0 = no cap
    max_inflight_per_worker: int = 2048  # L7 requests in flight per worker; above: 503 + Retry-After; 0 = no cap
    max_request_body_bytes: int = 0  # L7 request body (declared or streamed); above: 413; 0 = no cap (streamed)


class Acme(_Section):
    service: str = "acme"


DEFAULT_INTERNAL_CIDRS = [
    "127.0.0.0/8",
    "::1/128",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "fc00::/7",
]


class Network(_Section):
    internal_cidrs: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_INTERNAL_CIDRS))
    internal_l4_any_source: bool = False  # listen.internal_l4 also pipes sources outside internal_cidrs


class Sources(_Section):
    registry: Literal["file", "valkey"] = "file"
    domains: Literal["file", "postgres"] = "file"
    valkey_url: str = "redis://127.0.0.1:6379/0"
    postgres_dsn: str = "postgresql://sentin8_proxy@127.0.0.1:5432/platform"
    apps_domain: str = "apps.example.com"
    poll_interval_s: float = 30
    health_fresh_s: float = 30
    health_refresh_s: float = 10  # registry re-read for heartbeats, which Captain does not announce
    suspect_ttl_s: float = 30
    boot_retries: int = 10
    boot_retry_interval_s: float = 3


class Tls(_Section):
    cert_dir: str = "/var/lib/sentin8-proxy/certs"
    state_dir: str = "/var/lib/sentin8-proxy"
    client_ca_file: str = ""  # verify external client certificates against it (optional; sent as X-Sentin8-Client-Cert)
    ticket_key_rotation_s: float = 3600  # fleet-wide session-ticket keys; the previous key still decrypts


class Upstream(_Section):
    connect_timeout_s: float = 3
    response_timeout_s: float = 60  # request fully sent -> first response byte, else 504 (not for tunnels)
    client_cert: str = ""
    client_key: str = ""
    ca_file: str = ""
    pool_max_idle_per_instance: int = 128  # per worker; like nginx's upstream keepalive 128 in bench/


class WafExclusionEntry(_Section):
    """``[[policy.waf_exclusions]]``: CRS rules switched off for one host (or ``*.domain``), for false positives."""

    host: str
    rule_ids: list[int]


class Policy(_Section):
    waf: bool = False
    waf_paranoia: int = 1  # CRS paranoia level 1-4
    waf_anomaly_threshold: int = 5  # inbound anomaly score that blocks (CRS default; one critical match)
    waf_body_max: int = 128 * 1024  # request body buffered and inspected before anything goes upstream
    waf_oversize: Literal["reject", "inspect_prefix"] = "reject"  # a bigger body: 413, or inspect its first part
    waf_crs_dir: str = "/usr/share/modsecurity-crs/rules"  # a CRS 3.3.x or 4.x rules/ (default: Debian's 3.3.4)
    waf_exclusions: list[WafExclusionEntry] = msgspec.field(default_factory=list)
    rate_limit: bool = False
    rate_limit_rps: float = 100
    rate_limit_burst: float = 100
    rate_limit_key: Literal["ip", "ip+host", "host"] = "ip"
    max_headers: int = 100
    max_header_bytes: int = 65536


class Breaker(_Section):
    """Per-instance circuit breaker (rsx-gateway's Closed -> Open -> HalfOpen), shared by every worker."""

    enabled: bool = True
    failures: int = 5  # consecutive failures that open it
    failure_ratio: float = 0.5  # or this share of failures ...
    min_requests: int = 20  # ... over at least this many results in one window
    window_s: float = 10
    open_s: float = 10  # then one probe request (HalfOpen)
    probe_timeout_s: float = 10  # a probe that never reports frees the next one after this


class Mgmt(_Section):
    jwt_secret_env: str = "SENTIN8_MGMT_JWT_SECRET"
    jwt_audience: str = "sentin8-proxy"
    jwt_issuer: str = "sentin8-auth"


class Metrics(_Section):
    channel: str = "stat:metrics"
    interval_s: float = 10
    valkey_url: str = ""  # publish here; empty = sources.valkey_url when sources.registry = "valkey", else off


class Log(_Section):
    access: bool = False  # one JSON line per L7 request on stderr (never path, query, header values or body)


class SharedMemory(_Section):
    """Fixed sizes of the shared-memory regions, chosen at start (a reload cannot resize them)."""

    snapshot_bytes: int = 32 * 1024 * 1024  # per buffer; there are two
    suspect_slots: int = 4096
    ratelimit_slots: int = 65536
    conncap_slots: int = 16384  # per-client-IP connection counters (a sketch: keep well above concurrent clients)
    breaker_slots: int = 4096
    metrics_services: int = 256  # services counted by name; beyond it they are counted under "_other"


class Cluster(_Section):
    """Several hosts sharing state through Valkey (docs/cluster.md). Read at start: a reload keeps the values the
    fleet started with (the shared-memory layout depends on ``enabled``)."""

    enabled: bool = False  # share limits, ticket keys and runtime policy with the other hosts via Valkey
    valkey_url: str = ""  # empty = sources.valkey_url
    cluster_id: str = "default"  # hosts with the same id share state
    node_id: str = ""  # empty = hostname:port of listen.https
    sync_interval_ms: int = 50  # rate-limit sync period (T in the bound)
    fallback: Literal["per_host", "share"] = "per_host"  # Valkey unreachable: full limit per host, or R / hosts
    secret_env: str = "SENTIN8_CLUSTER_SECRET"  # required when enabled: >= 32 bytes, read before fork


class InstanceEntry(_Section):
    service: str
    id: str
    host: str
    port: int
    state: str = "Active"
    tls: bool = False


class DomainEntry(_Section):
    hostname: str
    service: str
    env_id: str = ""
    app_id: str = ""
    org_id: str = ""


class Config(_Section):
    listen: Listen = msgspec.field(default_factory=Listen)
    fleet: Fleet = msgspec.field(default_factory=Fleet)
    limits: Limits = msgspec.field(default_factory=Limits)
    acme: Acme = msgspec.field(default_factory=Acme)
    network: Network = msgspec.field(default_factory=Network)
    sources: Sources = msgspec.field(default_factory=Sources)
    tls: Tls = msgspec.field(default_factory=Tls)
    upstream: Upstream = msgspec.field(default_factory=Upstream)
    policy: Policy = msgspec.field(default_factory=Policy)
    breaker: Breaker = msgspec.field(default_factory=Breaker)
    mgmt: Mgmt = msgspec.field(default_factory=Mgmt)
    metrics: Metrics = msgspec.field(default_factory=Metrics)
    log: Log = msgspec.field(default_factory=Log)
    shm: SharedMemory = msgspec.field(default_factory=SharedMemory)
    cluster: Cluster = msgspec.field(default_factory=Cluster)
    instances: list[InstanceEntry] = msgspec.field(default_factory=list)
    domains: list[DomainEntry] = msgspec.field(default_factory=list)

    def metrics_valkey_url(self) -> str:
        """Where ``stat:metrics`` goes: ``metrics.valkey_url``, else the registry's Valkey, else nowhere ("")."""
        if self.metrics.valkey_url:
            return self.metrics.valkey_url
        return self.sources.valkey_url if self.sources.registry == "valkey" else ""

    def cluster_valkey_url(self) -> str:
        """Where the cluster's shared state lives: ``cluster.valkey_url``, else ``sources.valkey_url``."""
        return self.cluster.valkey_url or self.sources.valkey_url

    def cluster_node_id(self) -> str:
        """This host's name in the cluster: ``cluster.node_id``, else ``hostname:port`` of ``listen.https``."""
        if self.cluster.node_id:
            return self.cluster.node_id
        return f"{socket.gethostname()}:{parse_hostport(self.listen.https, 'listen.https')[1]}"

    def worker_count(self) -> int:
        return self.fleet.workers or len(os.sched_getaffinity(0))


def parse_hostport(value: str, key: str) -> tuple[str, int]:
    """``"0.0.0.0:443"`` / ``"[::]:443"`` -> (host, port). The host must be a literal IP address."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([0-9.]+):(\d+)", value)
    if not m:
        raise ConfigError(f"{key}: {value!r} is not HOST:PORT (IPv6 as [addr]:port)")
    host = m.group(1) or m.group(3)
    port = int(m.group(2) or m.group(4))
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"{key}: {host!r} is not an IP address") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"{key}: port {port} is out of range")
    return host, port


_HOSTNAME = re.compile(r"(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def _check(cfg: Config) -> None:
    parse_hostport(cfg.listen.https, "listen.https")
    for key, value in (
        ("listen.http", cfg.listen.http),
        ("listen.mgmt", cfg.listen.mgmt),
        ("listen.internal_l4", cfg.listen.internal_l4),
    ):
        if value:
            parse_hostport(value, key)
    for i, cidr in enumerate(cfg.network.internal_cidrs):
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError as exc:
            raise ConfigError(f"network.internal_cidrs[{i}]: {cidr!r} is not a CIDR ({exc})") from None
    positive = {
        "fleet.drain_timeout_s": cfg.fleet.drain_timeout_s,
        "fleet.drain_idle_grace_s": cfg.fleet.drain_idle_grace_s,
        "limits.peek_timeout_s": cfg.limits.peek_timeout_s,
        "limits.handshake_timeout_s": cfg.limits.handshake_timeout_s,
        "limits.header_timeout_s": cfg.limits.header_timeout_s,
        "limits.idle_timeout_s": cfg.limits.idle_timeout_s,
        "sources.poll_interval_s": cfg.sources.poll_interval_s,
        "sources.health_fresh_s": cfg.sources.health_fresh_s,
        "sources.health_refresh_s": cfg.sources.health_refresh_s,
        "sources.suspect_ttl_s": cfg.sources.suspect_ttl_s,
        "upstream.connect_timeout_s": cfg.upstream.connect_timeout_s,
        "upstream.response_timeout_s": cfg.upstream.response_timeout_s,
        "policy.rate_limit_rps": cfg.policy.rate_limit_rps,
        "policy.rate_limit_burst": cfg.policy.rate_limit_burst,
        "metrics.interval_s": cfg.metrics.interval_s,
    }
    for key, value in positive.items():
        if not value > 0:
            raise ConfigError(f"{key}: must be > 0, got {value}")
    if cfg.sources.health_refresh_s >= cfg.sources.health_fresh_s:
        raise ConfigError(
            f"sources.health_refresh_s: must be below sources.health_fresh_s ({cfg.sources.health_fresh_s:g}),"
            f" got {cfg.sources.health_refresh_s:g}: heartbeats would be read too late"
        )
    if not 60 <= cfg.tls.ticket_key_rotation_s <= 7 * 86400:
        # RFC 8446 caps a ticket's lifetime at 7 days; below a minute tickets would barely outlive a page load.
        raise ConfigError(
            f"tls.ticket_key_rotation_s: must be within 60..604800, got {cfg.tls.ticket_key_rotation_s:g}"
        )
    if cfg.listen.internal_l4 and cfg.listen.internal_l4 == cfg.listen.https:
        raise ConfigError("listen.internal_l4: must differ from listen.https")
    if cfg.fleet.workers < 0:
        raise ConfigError(f"fleet.workers: must be >= 0 (0 = one per CPU), got {cfg.fleet.workers}")
    if not 517 <= cfg.limits.peek_max_bytes <= 65536:
        raise ConfigError(f"limits.peek_max_bytes: must be within 517..65536, got {cfg.limits.peek_max_bytes}")
    if not 1 <= cfg.policy.max_headers <= 10000:
        raise ConfigError(f"policy.max_headers: must be within 1..10000, got {cfg.policy.max_headers}")
    if not 1024 <= cfg.policy.max_header_bytes <= 1 << 20:
        raise ConfigError(f"policy.max_header_bytes: must be within 1024..1048576, got {cfg.policy.max_header_bytes}")
    pol = cfg.policy
    if not 1 <= pol.waf_paranoia <= 4:
        raise ConfigError(f"policy.waf_paranoia: must be within 1..4, got {pol.waf_paranoia}")
    if not 1 <= pol.waf_anomaly_threshold <= 1000:
        raise ConfigError(f"policy.waf_anomaly_threshold: must be within 1..1000, got {pol.waf_anomaly_threshold}")
    if not 1024 <= pol.waf_body_max <= 16 << 20:
        raise ConfigError(f"policy.waf_body_max: must be within 1024..16777216, got {pol.waf_body_max}")
    for i, ex in enumerate(pol.waf_exclusions):
        if not _HOSTNAME.fullmatch(ex.host.lower()):
            raise ConfigError(f"policy.waf_exclusions[{i}].host: {ex.host!r} is not a hostname or *.wildcard")
        if not ex.rule_ids or any(not 1 <= r <= 9_999_999 for r in ex.rule_ids):
            raise ConfigError(f"policy.waf_exclusions[{i}].rule_ids: needs rule ids (1..9999999), got {ex.rule_ids}")
    if cfg.shm.snapshot_bytes < 4096:
        raise ConfigError(f"shm.snapshot_bytes: must be >= 4096, got {cfg.shm.snapshot_bytes}")
    if cfg.limits.max_connections_per_ip < 0 or cfg.limits.max_inflight_per_worker < 0:
        which = "max_connections_per_ip" if cfg.limits.max_connections_per_ip < 0 else "max_inflight_per_worker"
        raise ConfigError(f"limits.{which}: must be >= 0 (0 = no cap)")
    body_cap = cfg.limits.max_request_body_bytes
    if body_cap < 0:
        raise ConfigError(f"limits.max_request_body_bytes: must be >= 0 (0 = no cap), got {body_cap}")
    br = cfg.breaker
    if br.failures < 1 or br.min_requests < 1:
        raise ConfigError(f"breaker.{'failures' if br.failures < 1 else 'min_requests'}: must be >= 1")
    if not 0 < br.failure_ratio <= 1:
        raise ConfigError(f"breaker.failure_ratio: must be within (0, 1], got {br.failure_ratio}")
    for key in ("window_s", "open_s", "probe_timeout_s"):
        if not getattr(br, key) > 0:
            raise ConfigError(f"breaker.{key}: must be > 0, got {getattr(br, key)}")
    for key, least in (("suspect_slots", 64), ("ratelimit_slots", 512), ("conncap_slots", 64), ("breaker_slots", 64)):
        n = getattr(cfg.shm, key)
        if n < least or n & (n - 1):
            raise ConfigError(f"shm.{key}: must be a power of two >= {least}, got {n}")
    if not 2 <= cfg.shm.metrics_services <= 65536:
        raise ConfigError(f"shm.metrics_services: must be within 2..65536, got {cfg.shm.metrics_services}")
    if cfg.metrics.valkey_url and not re.match(r"(redis|rediss|unix)://", cfg.metrics.valkey_url):
        url = cfg.metrics.valkey_url
        raise ConfigError(f"metrics.valkey_url: must be a redis://, rediss:// or unix:// URL, got {url!r}")
    _check_cluster(cfg)
    if not cfg.metrics.channel:
        raise ConfigError("metrics.channel: must not be empty")
    if bool(cfg.upstream.client_cert) != bool(cfg.upstream.client_key):
        raise ConfigError("upstream.client_cert: client_cert and client_key must be set together")
    seen: set[str] = set()
    for i, inst in enumerate(cfg.instances):
        key = f"instances[{i}]"
        if inst.id in seen:
            raise ConfigError(f"{key}.id: duplicate instance id {inst.id!r}")
        seen.add(inst.id)
        if not 1 <= inst.port <= 65535:
            raise ConfigError(f"{key}.port: {inst.port} is out of range")
        try:
            ipaddress.ip_address(inst.host)
        except ValueError:
            raise ConfigError(f"{key}.host: {inst.host!r} is not an IP address") from None
    for i, dom in enumerate(cfg.domains):
        if not _HOSTNAME.fullmatch(dom.hostname.lower()):
            raise ConfigError(f"domains[{i}].hostname: {dom.hostname!r} is not a hostname or *.wildcard")


_CLUSTER_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def _check_cluster(cfg: Config) -> None:
    cl = cfg.cluster
    if not _CLUSTER_ID.fullmatch(cl.cluster_id):
        raise ConfigError(f"cluster.cluster_id: 1-64 of A-Z a-z 0-9 . _ : -, got {cl.cluster_id!r}")
    if cl.node_id and not re.fullmatch(r"[!-~]{1,128}", cl.node_id):
        raise ConfigError(f"cluster.node_id: 1-128 printable characters without spaces, got {cl.node_id!r}")
    if not 10 <= cl.sync_interval_ms <= 10_000:
        raise ConfigError(f"cluster.sync_interval_ms: must be within 10..10000, got {cl.sync_interval_ms}")
    if cl.valkey_url and not re.match(r"(redis|rediss|unix)://", cl.valkey_url):
        raise ConfigError(f"cluster.valkey_url: must be a redis://, rediss:// or unix:// URL, got {cl.valkey_url!r}")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", cl.secret_env):
        raise ConfigError(f"cluster.secret_env: not an environment variable name: {cl.secret_env!r}")


def _dotted(path: str) -> str:
    """msgspec's ``$.listen.https`` / ``$.instances[0].port`` -> ``listen.https`` / ``instances[0].port``."""
    return path.removeprefix("$").removeprefix(".") or "(top level)"


def _explain(exc: msgspec.ValidationError) -> str:
    msg = str(exc)
    m = re.fullmatch(r"Object contains unknown field `([^`]*)`(?: - at `([^`]*)`)?", msg)
    if m:
        parent = _dotted(m.group(2) or "$")
        key = m.group(1) if parent == "(top level)" else f"{parent}.{m.group(1)}"
        return f"{key}: unknown key"
    m = re.fullmatch(r"Object missing required field `([^`]*)`(?: - at `([^`]*)`)?", msg)
    if m:
        parent = _dotted(m.group(2) or "$")
        key = m.group(1) if parent == "(top level)" else f"{parent}.{m.group(1)}"
        return f"{key}: required key is missing"
    m = re.fullmatch(r"(.*) - at `([^`]*)`", msg)
    if m:
        return f"{_dotted(m.group(2))}: {m.group(1)}"
    return msg


def load_bytes(data: bytes, origin: str = "<config>") -> Config:
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{origin}: not valid TOML ({exc})") from None
    try:
        cfg = msgspec.convert(raw, Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(_explain(exc)) from None
    _check(cfg)
    return cfg


def load_file(path: str) -> Config:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    return load_bytes(data, path)


def to_toml_dict(cfg: Config) -> dict:
    return msgspec.to_builtins(cfg)
