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
from typing import Annotated, Literal, NamedTuple
from urllib.parse import urlparse

import msgspec


class ValkeyTarget(NamedTuple):
    """How to reach one Valkey deployment (``sentin8.valkey_client.connect`` builds the client): the URL, and in
    sentinel or cluster mode the nodes that URL's host is replaced by."""

    url: str
    mode: str = "single"  # "single" | "sentinel" | "cluster"
    nodes: tuple[str, ...] = ()
    master: str = ""  # sentinel: the monitored master's name


class ConfigError(Exception):
    """A configuration problem, already phrased as ``key: reason``."""


def doc(text: str, example: object = None) -> msgspec.Meta:
    """A key's operator documentation, declared with it: ``key: Annotated[int, doc("...")] = 0``.

    The one place that says what a key does: the configuration reference (docs/configuration.md) and the
    annotated example (``check-config --print-defaults``) are generated from it (``python -m sentin8.docgen``),
    and a test fails when a key has none. ``example``: what the example shows for a key with no default.
    """
    return msgspec.Meta(description=text) if example is None else msgspec.Meta(description=text, examples=[example])


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class Listen(_Section):
    """Listening addresses (HOST:PORT, the host a literal IP address, IPv6 as ``[addr]:port``)."""

    https: Annotated[str, doc('every worker binds it with SO_REUSEPORT; "[::]:443" for dual stack')] = "0.0.0.0:443"
    http: Annotated[str, doc('ACME HTTP-01 challenges only (everything else: 404); "" = off')] = "0.0.0.0:80"
    mgmt: Annotated[str, doc('management API, dashboard and /metrics (its own process); "" = off')] = "127.0.0.1:9180"
    internal_l4: Annotated[
        str, doc('guaranteed-L4 listener: every connection SNI-routed and piped raw, e.g. "0.0.0.0:8443"; "" = off')
    ] = ""
    proxy_protocol_from: Annotated[
        list[str],
        doc(
            "L4 balancers (CIDRs) whose connections start with a PROXY v2 header (docs/proxy-protocol.md): from"
            " these, listen.https and listen.internal_l4 require one and its address is the client's for every"
            " decision; from any other source a PROXY header is refused; [] = none accepted"
        ),
    ] = msgspec.field(default_factory=list)


class Fleet(_Section):
    """The supervisor's worker processes."""

    workers: Annotated[int, doc("worker processes, each pinned to one CPU; 0 = one per usable CPU")] = 0
    drain_timeout_s: Annotated[
        float, doc("a draining worker exits at zero connections or after this long (raise TimeoutStopSec with it)")
    ] = 30
    drain_idle_grace_s: Annotated[
        float,
        doc(
            "a draining worker keeps idle keep-alive connections this long, answering their next request with"
            " Connection: close (HAProxy's idle-close-on-response), then closes those still idle"
        ),
    ] = 2
    restart_backoff_max_s: Annotated[float, doc("cap of the exponential backoff before a dead child restarts")] = 30
    rss_limit_mb: Annotated[int, doc("0 = only report RSS; > 0 = recycle (drain and replace) a worker above it")] = 0


class Limits(_Section):
    """Client deadlines and caps."""

    peek_timeout_s: Annotated[float, doc("the whole ClientHello must arrive within this (else a FIN)")] = 10
    peek_max_bytes: Annotated[
        int,
        doc(
            "largest ClientHello peeked, in wire bytes (517..65536): 32 KiB holds a hello in one maximal record"
            " (16,389 bytes on the wire) and the same hello split over several records; a larger hello is"
            " refused with illegal_parameter"
        ),
    ] = 32768
    handshake_timeout_s: Annotated[float, doc("TLS handshake deadline on the L7 path")] = 10
    header_timeout_s: Annotated[float, doc("a request head must be complete within this (slowloris)")] = 15
    idle_timeout_s: Annotated[float, doc("an idle keep-alive client connection is closed after this")] = 60
    max_connections_per_ip: Annotated[
        int, doc("concurrent connections per client address, all workers together; 0 = no cap")
    ] = 0
    max_inflight_per_worker: Annotated[
        int, doc("L7 requests in flight per worker; above it: 503 + Retry-After; 0 = no cap")
    ] = 2048
    max_request_body_bytes: Annotated[
        int, doc("L7 request body, declared or streamed; above it: 413; 0 = no cap (bodies stream)")
    ] = 0


class Acme(_Section):
    """ACME HTTP-01 challenges."""

    service: Annotated[str, doc("the registry service whose instances answer /.well-known/acme-challenge/*")] = "acme"


DEFAULT_INTERNAL_CIDRS = [
    "127.0.0.0/8",
    "::1/128",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "fc00::/7",
]


class Network(_Section):
    """The internal/external split: the source address decides L4 (internal) or L7 (external)."""

    internal_cidrs: Annotated[
        list[str], doc("sources piped raw at L4, never decrypted; everything else is terminated at L7")
    ] = msgspec.field(default_factory=lambda: list(DEFAULT_INTERNAL_CIDRS))
    internal_l4_any_source: Annotated[bool, doc("listen.internal_l4 also pipes sources outside internal_cidrs")] = False


class Sources(_Section):
    """Where routing data comes from: the instance registry and the domain table."""

    registry: Annotated[
        Literal["file", "valkey"], doc('"file" ([[instances]] below) or "valkey" (captain:svc:* hashes)')
    ] = "file"
    domains: Annotated[
        Literal["file", "postgres"], doc('"file" ([[domains]] below) or "postgres" (the sys.* tables)')
    ] = "file"
    valkey_url: Annotated[str, doc("the registry (redis://, rediss:// or unix://; Valkey or Redis)")] = (
        "redis://127.0.0.1:6379/0"
    )
    # How valkey_url is reached (docs/hosts.md). "sentinel" and "cluster" take their addresses from valkey_nodes
    # and keep the URL's scheme, credentials (and, behind Sentinel, the database); single mode ignores them.
    valkey_mode: Annotated[
        Literal["single", "sentinel", "cluster"],
        doc('"single" (valkey_url), "sentinel" (valkey_nodes are sentinels) or "cluster" (valkey_nodes seed it)'),
    ] = "single"
    valkey_nodes: Annotated[
        list[str], doc('"host:port" of the sentinels or of some cluster nodes (valkey_mode sentinel | cluster)')
    ] = msgspec.field(default_factory=list)
    sentinel_master: Annotated[str, doc("the master name the sentinels monitor (valkey_mode = sentinel)")] = ""
    postgres_dsn: Annotated[
        str,
        doc(
            "the domain tables (a libpq conninfo or URL; needs sql/grants.sql); several hosts with"
            " target_session_attrs / load_balance_hosts read standbys too (docs/hosts.md)"
        ),
    ] = "postgresql://sentin8_proxy@127.0.0.1:5432/platform"
    apps_domain: Annotated[str, doc("app instances answer <app>.<env>.<org>.<apps_domain>")] = "apps.example.com"
    poll_interval_s: Annotated[float, doc("safety poll of both sources, beside their change events")] = 30
    health_fresh_s: Annotated[
        float, doc("an instance whose health_ts is older gets no new connection (judged at pick time)")
    ] = 30
    health_refresh_s: Annotated[
        float, doc("registry re-read for heartbeats, which Captain does not announce (< health_fresh_s)")
    ] = 10
    suspect_ttl_s: Annotated[float, doc("an instance that failed a connect is tried last for this long")] = 30
    boot_retries: Annotated[int, doc("attempts at the first load before the fleet starts with what it has")] = 10
    boot_retry_interval_s: Annotated[float, doc("pause between those attempts")] = 3


class Tls(_Section):
    """Certificates and TLS state."""

    cert_dir: Annotated[
        str, doc("certificate store: <hostname>/fullchain.pem + privkey.pem, _wildcard.<domain>/... (certbot layout)")
    ] = "/var/lib/sentin8-proxy/certs"
    state_dir: Annotated[
        str,
        doc(
            "the fleet's writable state: bootstrap certificate, pid and reload status files, runtime policy"
            " (created if missing)"
        ),
    ] = "/var/lib/sentin8-proxy"
    client_ca_file: Annotated[
        str, doc('verify external client certificates against it (sent as X-Sentin8-Client-Cert); "" = off')
    ] = ""
    ticket_key_rotation_s: Annotated[
        float, doc("fleet-wide session-ticket key period (60..604800, applied at start); the previous key decrypts")
    ] = 3600


class Upstream(_Section):
    """Connections to the backends."""

    connect_timeout_s: Annotated[float, doc("connect (name lookup included) to one instance")] = 3
    response_timeout_s: Annotated[
        float, doc("request fully sent -> first response byte, else 504 (not for tunnels)")
    ] = 60
    client_cert: Annotated[str, doc("client certificate (PEM) for mTLS to bridge-mode (tls = true) backends")] = ""
    client_key: Annotated[str, doc("its private key (PEM); set both or neither")] = ""
    ca_file: Annotated[str, doc('verify backends against it; "" = encrypted but not authenticated')] = ""
    pool_max_idle_per_instance: Annotated[
        int, doc("idle keep-alive upstream connections kept per instance, per worker (like nginx's keepalive 128)")
    ] = 128


class WafExclusionEntry(_Section):
    """``[[policy.waf_exclusions]]``: CRS rules switched off for one host (or ``*.domain``), for false positives."""

    host: Annotated[str, doc('a hostname or "*.domain"', "legacy.example.com")]
    rule_ids: Annotated[list[int], doc("the CRS rule ids switched off for it", [942100, 920420])]


class Policy(_Section):
    """Edge policy on the L7 path (waf and rate_limit* can also change at run time: PUT /policy)."""

    waf: Annotated[bool, doc("ModSecurity v3 + OWASP CRS in anomaly-scoring mode: 403 (docs/waf.md)")] = False
    waf_paranoia: Annotated[int, doc("CRS paranoia level 1-4")] = 1
    waf_anomaly_threshold: Annotated[
        int, doc("inbound anomaly score that blocks (5, the CRS default: one critical match)")
    ] = 5
    waf_body_max: Annotated[int, doc("request body bytes buffered and inspected before anything goes upstream")] = (
        128 * 1024
    )
    waf_oversize: Annotated[
        Literal["reject", "inspect_prefix"],
        doc('a bigger body: "reject" (413) or "inspect_prefix" (its first waf_body_max bytes, then streamed)'),
    ] = "reject"
    waf_crs_dir: Annotated[
        str, doc("a CRS 3.3.x or 4.x rules/ directory (default: Debian's 3.3.4; CRS 4 is the one to run)")
    ] = "/usr/share/modsecurity-crs/rules"
    waf_exclusions: Annotated[
        list[WafExclusionEntry], doc("[[policy.waf_exclusions]] host + rule_ids: CRS rules off for one host")
    ] = msgspec.field(default_factory=list)
    rate_limit: Annotated[bool, doc("429 from token buckets shared by every worker in shared memory")] = False
    rate_limit_rps: Annotated[float, doc("tokens per second per key, for the whole fleet")] = 100
    rate_limit_burst: Annotated[float, doc("bucket size: requests admitted at once after idle time")] = 100
    rate_limit_key: Annotated[
        Literal["ip", "ip+host", "host"], doc('"ip", "ip+host" or "host" (per domain, whoever asks)')
    ] = "ip"
    max_headers: Annotated[int, doc("more header lines than this (Host included): 431")] = 100
    max_header_bytes: Annotated[int, doc("a request head larger than this: 431")] = 65536


class Breaker(_Section):
    """Per-instance circuit breaker (rsx-gateway's Closed -> Open -> HalfOpen), shared by every worker."""

    enabled: Annotated[bool, doc("breakers on")] = True
    failures: Annotated[int, doc("consecutive failures that open it ...")] = 5
    failure_ratio: Annotated[float, doc("... or this share of failures ...")] = 0.5
    min_requests: Annotated[int, doc("... over at least this many results in one window")] = 20
    window_s: Annotated[float, doc("the window of failure_ratio")] = 10
    open_s: Annotated[float, doc("open this long, then one probe request (HalfOpen)")] = 10
    probe_timeout_s: Annotated[float, doc("a probe that never reports frees the next one after this")] = 10


class Mgmt(_Section):
    """The management API's tokens (used whenever listen.mgmt is not "")."""

    jwt_secret_env: Annotated[
        str, doc("the environment variable holding the HS256 secret (>= 32 bytes), never the secret itself")
    ] = "SENTIN8_MGMT_JWT_SECRET"
    jwt_audience: Annotated[str, doc("required aud claim")] = "sentin8-proxy"
    jwt_issuer: Annotated[str, doc("required iss claim")] = "sentin8-auth"


class Metrics(_Section):
    """The stat:metrics document the resolver publishes (Prometheus needs no key: GET /metrics)."""

    channel: Annotated[str, doc("the PUBLISH channel")] = "stat:metrics"
    interval_s: Annotated[float, doc("one document (deltas since the previous one) this often")] = 10
    valkey_url: Annotated[
        str, doc('publish here; "" = sources.valkey_url when sources.registry = "valkey", else off')
    ] = ""


class Http2(_Section):
    """HTTP/2 for external clients (ALPN ``h2``, preferred when offered); off = HTTP/1.1 only."""

    enabled: Annotated[
        bool, doc("serve HTTP/2 to external clients that offer it (docs/http2.md); false = HTTP/1.1 only")
    ] = True
    max_requests: Annotated[
        int,
        doc(
            "streams served on one connection, then GOAWAY NO_ERROR and the client reconnects (nginx's "
            "keepalive_requests, also 1000 by default)"
        ),
    ] = 1000


class Log(_Section):
    """Logs (JSON lines on stderr)."""

    access: Annotated[
        bool, doc("one JSON line per L7 request on stderr (never path, query, header values or body)")
    ] = False


class SharedMemory(_Section):
    """Fixed sizes of the shared-memory regions, chosen at start (a reload cannot resize them)."""

    snapshot_bytes: Annotated[int, doc("routing snapshot buffer size (>= 4096); there are two")] = 32 * 1024 * 1024
    suspect_slots: Annotated[int, doc("suspect-instance marks (a power of two >= 64)")] = 4096
    ratelimit_slots: Annotated[int, doc("rate-limit buckets (a power of two >= 512)")] = 65536
    conncap_slots: Annotated[
        int, doc("per-client-IP connection counters, a sketch: keep well above concurrent clients (power of two)")
    ] = 16384
    breaker_slots: Annotated[int, doc("circuit breakers, one per instance (a power of two >= 64)")] = 4096
    metrics_services: Annotated[int, doc('services counted by name (2..65536); beyond it they count as "_other"')] = 256


class Cluster(_Section):
    """Several hosts sharing state through Valkey (docs/cluster.md). Read at start: a reload keeps the values the
    fleet started with (the shared-memory layout depends on ``enabled``)."""

    enabled: Annotated[
        bool, doc("share rate limits and runtime policy with the other hosts via Valkey (docs/cluster.md)")
    ] = False
    valkey_url: Annotated[str, doc('the Valkey the hosts share; "" = sources.valkey_url')] = ""
    cluster_id: Annotated[str, doc("hosts with the same id share state")] = "default"
    node_id: Annotated[str, doc('this host\'s name among them; "" = hostname:port of listen.https')] = ""
    sync_interval_ms: Annotated[int, doc("rate-limit sync period (T in the bound of docs/cluster.md)")] = 50
    fallback: Annotated[
        Literal["per_host", "share"],
        doc('Valkey unreachable: "per_host" = the full limit on each host, "share" = R / hosts last seen'),
    ] = "per_host"
    secret_env: Annotated[
        str,
        doc("environment variable holding the cluster secret: required when enabled, >= 32 bytes, read before fork"),
    ] = "SENTIN8_CLUSTER_SECRET"


class InstanceEntry(_Section):
    """``[[instances]]``: the file registry (sources.registry = "file")."""

    service: Annotated[str, doc("the service the instance belongs to", "web")]
    id: Annotated[str, doc("unique instance id", "web-1")]
    host: Annotated[str, doc("its IP address", "127.0.0.1")]
    port: Annotated[int, doc("its port", 9001)]
    state: Annotated[str, doc('only "Active" instances get traffic')] = "Active"
    tls: Annotated[bool, doc("L7: bridge over TLS (true) or plain TCP offload (false)")] = False
    proxy_protocol: Annotated[
        Literal["", "v2"], doc('"v2": an L4 pipe to it starts with a PROXY v2 header (docs/proxy-protocol.md)')
    ] = ""


class DomainEntry(_Section):
    """``[[domains]]``: the file domain table (sources.domains = "file"); "*.example.com" wildcards allowed."""

    hostname: Annotated[str, doc("the name clients send as SNI", "shop.apps.example.com")]
    service: Annotated[str, doc("the service that answers it", "web")]
    env_id: Annotated[str, doc("sent upstream as X-Sentin8-Env-Id")] = ""
    app_id: Annotated[str, doc("sent upstream as X-Sentin8-App-Id")] = ""
    org_id: Annotated[str, doc("the owning org")] = ""


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
    http2: Http2 = msgspec.field(default_factory=Http2)
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

    def sources_valkey(self) -> ValkeyTarget:
        """The sources' Valkey with its mode: the registry, the change events, and what defaults to it."""
        src = self.sources
        return ValkeyTarget(src.valkey_url, src.valkey_mode, tuple(src.valkey_nodes), src.sentinel_master)

    def _valkey_or_sources(self, url: str) -> ValkeyTarget:
        """A section's own URL is a single server; its default (the sources' URL) keeps the sources' mode."""
        if url and url != self.sources.valkey_url:
            return ValkeyTarget(url)
        return self.sources_valkey()

    def metrics_valkey(self) -> ValkeyTarget | None:
        """``metrics_valkey_url`` with its mode; None = nothing is published."""
        url = self.metrics_valkey_url()
        return self._valkey_or_sources(url) if url else None

    def cluster_valkey(self) -> ValkeyTarget:
        """``cluster_valkey_url`` with its mode (``cluster.valkey_url`` set = a single server)."""
        return self._valkey_or_sources(self.cluster.valkey_url)

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


LISTEN_KEYS = ("https", "http", "internal_l4", "mgmt")  # every address the fleet listens on, in [listen]


def listen_addresses(cfg: Config) -> list[tuple[str, str]]:
    """``(listen.X, address)`` for each listener the config turns on."""
    return [(f"listen.{name}", getattr(cfg.listen, name)) for name in LISTEN_KEYS if getattr(cfg.listen, name)]


def _overlaps(a: tuple[str, int], b: tuple[str, int]) -> bool:
    """Two binds that would take the same connections: the same port and the same address, or a wildcard
    that covers the other ("[::]" is dual stack, so it covers IPv4 too). Port 0 is a new port each time."""
    (host_a, port_a), (host_b, port_b) = a, b
    if port_a != port_b or port_a == 0:
        return False
    ip_a, ip_b = ipaddress.ip_address(host_a), ipaddress.ip_address(host_b)
    if ip_a == ip_b or str(ip_a) == "::" or str(ip_b) == "::":
        return True
    return ip_a.version == ip_b.version == 4 and (str(ip_a) == "0.0.0.0" or str(ip_b) == "0.0.0.0")


def _check_listen_overlap(cfg: Config) -> None:
    """Each listener its own address: connections landing on the wrong one (plain HTTP on the TLS port,
    TLS on the management API) fail in ways a client cannot explain."""
    seen: list[tuple[str, str, tuple[str, int]]] = []
    for key, address in listen_addresses(cfg):
        parsed = parse_hostport(address, key)
        for other_key, other, other_parsed in seen:
            if _overlaps(parsed, other_parsed):
                how = "is also" if address == other else "overlaps"
                raise ConfigError(f"{key}: {address} {how} {other_key} ({other}): each listener needs its own address")
        seen.append((key, address, parsed))


def _check(cfg: Config) -> None:
    parse_hostport(cfg.listen.https, "listen.https")
    for key, value in (
        ("listen.http", cfg.listen.http),
        ("listen.mgmt", cfg.listen.mgmt),
        ("listen.internal_l4", cfg.listen.internal_l4),
    ):
        if value:
            parse_hostport(value, key)
    _check_listen_overlap(cfg)
    for key, cidrs in (
        ("network.internal_cidrs", cfg.network.internal_cidrs),
        ("listen.proxy_protocol_from", cfg.listen.proxy_protocol_from),
    ):
        for i, cidr in enumerate(cidrs):
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError as exc:
                raise ConfigError(f"{key}[{i}]: {cidr!r} is not a CIDR ({exc})") from None
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
    if cfg.http2.max_requests < 1:
        raise ConfigError(f"http2.max_requests: must be >= 1, got {cfg.http2.max_requests}")
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
    _check_valkey_mode(cfg)
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


_NODE = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(?P<port>[0-9]{1,5})")


def _check_valkey_mode(cfg: Config) -> None:
    src = cfg.sources
    if src.valkey_mode == "single":
        return
    if not src.valkey_nodes:
        raise ConfigError(f'sources.valkey_mode: "{src.valkey_mode}" needs sources.valkey_nodes ("host:port", ...)')
    for i, node in enumerate(src.valkey_nodes):
        m = _NODE.fullmatch(node)
        if m is None or not 0 < int(m["port"]) < 65536:
            raise ConfigError(f"sources.valkey_nodes[{i}]: {node!r} is not host:port")
    if src.valkey_mode == "sentinel" and not src.sentinel_master:
        raise ConfigError('sources.valkey_mode: "sentinel" needs sources.sentinel_master (the monitored name)')
    if src.valkey_mode == "cluster" and urlparse(src.valkey_url).path.strip("/") not in ("", "0"):
        raise ConfigError('sources.valkey_mode: "cluster" has database 0 only; valkey_url names another')


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
