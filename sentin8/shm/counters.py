"""Per-worker counters: one block per worker slot, one writer per block, readers sum the blocks.

Counters are cumulative across respawns (a new worker in a slot keeps adding); gauges (``GAUGES``) belong to
the live process and the supervisor zeroes them when that process dies.
"""

from __future__ import annotations

from .region import CACHE_LINE, align

NAMES: tuple[str, ...] = (
    # accept / peek / classify
    "accepted",
    "accept_errors",
    "connections_l4",
    "connections_l7",
    "connections_http",
    "peek_timeout",
    "peek_garbage",
    "peek_oversize",
    "peek_eof",
    "no_sni",
    "unknown_sni",
    "no_backend",
    "backend_connect_errors",
    "all_suspect_fallback",
    "l4_bytes_in",
    "l4_bytes_out",
    # TLS
    "handshake_ok",
    "handshake_errors",
    "handshake_timeout",
    "tls_resumed",  # handshakes that resumed a session (a ticket from any worker of the fleet)
    "tls_alpn_refused",  # ALPN offered, nothing the edge speaks: no_application_protocol alert
    "peek_bad_version",  # record version major != 3: protocol_version alert, then close
    "cert_rejected",  # a store pair present but unusable (each worker counts the file versions it read)
    "cert_expiring",  # a certificate in use with less than 7 days left (once per certificate per worker)
    "connections_internal_l4",  # accepted on listen.internal_l4 and piped raw
    "internal_l4_refused",  # listen.internal_l4 from outside network.internal_cidrs (not allowed)
    # L7
    "requests",
    "http_400",
    "http_403",
    "http_404",
    "http_421",
    "http_429",
    "http_431",
    "http_502",
    "http_503",
    "http_504",
    "status_1xx",
    "status_2xx",
    "status_3xx",
    "status_4xx",
    "status_5xx",
    "upstream_warm",
    "upstream_cold",
    "upstream_stale_retry",
    "upstream_errors",
    "upstream_timeout",
    "slowloris_closed",
    "idle_closed",
    "drain_idle_closed",
    "websocket_upgrades",
    "acme_passthrough",
    "policy_waf",
    "policy_rate_limit",
    "policy_blocked",
    "http_405",
    "http_408",
    "http_413",
    "http_414",
    "http_501",
    "http_505",
    "status_other",
    "acme_requests",
    "backpressure_client_paused",
    "backpressure_upstream_paused",
    "body_timeout",
    "bridge_errors",
    "client_aborted",
    "upstream_connect_failed",
    "upstream_truncated",
    "upstream_unavailable",
    "websocket_bad_accept",  # a 101 without the Sec-WebSocket-Accept the client's key demands: 502
    # WAF (issue 12): inspections, refusals, and matched CRS rules by family (sentin8.waf.FAMILIES)
    "waf_inspected",
    "waf_offloaded",
    "waf_errors",
    "waf_body_too_large",
    "waf_log_suppressed",
    "waf_engine_builds",  # rule sets loaded off the loop after a runtime change
    "waf_rule_method",
    "waf_rule_scanner",
    "waf_rule_protocol",
    "waf_rule_protocol_attack",
    "waf_rule_multipart",
    "waf_rule_lfi",
    "waf_rule_rfi",
    "waf_rule_rce",
    "waf_rule_php",
    "waf_rule_nodejs",
    "waf_rule_xss",
    "waf_rule_sqli",
    "waf_rule_session_fixation",
    "waf_rule_java",
    "waf_rule_body_parse",
    # caps and fail-fast (issue 12): every refusal by kind, and the breakers' transitions
    "refused_conn_cap_l7",
    "refused_conn_cap_l4",
    "refused_inflight",
    "refused_breaker_open",
    "breaker_skipped",
    "breaker_opened",
    "breaker_closed",
    "unknown_counter",  # a name missing from this table: counted here rather than crash a connection
    "gauge_underflow",  # a gauge decremented below zero: a release without its acquire (a bug; tests assert 0)
    # latency histogram of L7 responses (upper bounds in ms) and its sum
    "latency_le_1ms",
    "latency_le_5ms",
    "latency_le_10ms",
    "latency_le_25ms",
    "latency_le_50ms",
    "latency_le_100ms",
    "latency_le_250ms",
    "latency_le_500ms",
    "latency_le_1000ms",
    "latency_le_5000ms",
    "latency_le_inf",
    "latency_sum_us",
    # gauges
    "l4_active",
    "active_connections",  # L7 requests in flight: the drain signal
    "open_connections",
)
GAUGES = ("l4_active", "active_connections", "open_connections")
MAX_COUNTERS = 128
INDEX = {name: i for i, name in enumerate(NAMES)}
_UNKNOWN = INDEX["unknown_counter"]
_UNDERFLOW = INDEX["gauge_underflow"]
_LATENCY = tuple(
    (float(n.removeprefix("latency_le_").removesuffix("ms")) if n != "latency_le_inf" else float("inf"), INDEX[n])
    for n in NAMES
    if n.startswith("latency_le_")
)
_LAT_SUM = INDEX["latency_sum_us"]
BLOCK_BYTES = align(MAX_COUNTERS * 8, CACHE_LINE)
assert len(NAMES) <= MAX_COUNTERS


def region_bytes(slots: int) -> int:
    return slots * BLOCK_BYTES


class WorkerCounters:
    """The writer's handle on its own block."""

    def __init__(self, view: memoryview, slot: int) -> None:
        start = slot * BLOCK_BYTES
        self.words = view[start : start + BLOCK_BYTES].cast("Q")

    def inc(self, name: str, n: int = 1) -> None:
        i = INDEX.get(name, _UNKNOWN)
        self.words[i] = self.words[i] + n

    def observe_latency(self, seconds: float) -> None:
        ms = seconds * 1000.0
        i = next(index for bound, index in _LATENCY if ms <= bound)  # the last bound is inf
        self.words[i] = self.words[i] + 1
        self.words[_LAT_SUM] = self.words[_LAT_SUM] + int(seconds * 1e6)

    def add_gauge(self, name: str, delta: int) -> None:
        i = INDEX[name]
        value = self.words[i] + delta
        if value < 0:
            # Never hidden by a silent clamp: counted, so the fleet tests (and operators) see the bug.
            self.words[_UNDERFLOW] = self.words[_UNDERFLOW] + 1
            value = 0
        self.words[i] = value

    def zero_gauges(self) -> None:
        for name in GAUGES:
            self.words[INDEX[name]] = 0


class CounterReader:
    def __init__(self, view: memoryview, slots: int) -> None:
        self._view = view
        self.slots = slots

    def block(self, slot: int) -> dict[str, int]:
        start = slot * BLOCK_BYTES
        w = self._view[start : start + BLOCK_BYTES].cast("Q")
        return {name: w[i] for i, name in enumerate(NAMES)}

    def total(self) -> dict[str, int]:
        out = dict.fromkeys(NAMES, 0)
        for slot in range(self.slots):
            start = slot * BLOCK_BYTES
            w = self._view[start : start + BLOCK_BYTES].cast("Q")
            for i, name in enumerate(NAMES):
                out[name] += w[i]
        return out

    def zero_gauges(self, slot: int) -> None:
        WorkerCounters(self._view, slot).zero_gauges()
