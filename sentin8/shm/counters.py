"""Shared counters: one block per worker slot, one writer per block, readers sum the blocks.

A block holds the fleet-wide names (``NAMES``: connections, errors, handshake-error reasons, policy-block kinds,
traffic sides, gauges) and then one row of ``SERVICE_WORDS`` per service index (``sentin8.shm.services``):
requests per status slot, the latency histogram with its sum and interval max, upstream warm/cold/stale-retry
and L4 connections. A worker increments words by index: no string-keyed dict is built per request.

Totals are monotonic for the fleet's life. A worker that dies (or is replaced by a reload) has its block
folded into the **retired** block by the supervisor at reap (``CounterReader.retire``) and zeroed for the
next worker of that slot; readers sum live blocks + retired. The fold runs under a sequence word (odd while
folding) so a reader never sees a count twice or not at all. Gauges (``GAUGES``) belong to the live process:
they are zeroed at reap, never folded.

Region layout: a 64-byte header (fold sequence, max epoch, publisher sequence), then ``slots`` worker blocks,
the retired block and the publisher's baseline block (what the last ``stat:metrics`` document covered).
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..http.h2_budget import REASONS as _H2_BUDGET_REASONS
from ..http.h2_events import REASONS as _H2_ENGINE_REASONS
from ..http.h2_request import REASONS as _H2_REQUEST_REASONS
from ..metrics.scales import (
    LATENCY_BOUNDS_S,
    LATENCY_BOUNDS_US,
    LATENCY_BUCKETS,
    OTHER_STATUS_SLOT,
    STATUS_SLOT_OF,
    STATUS_SLOTS,
)
from .region import CACHE_LINE, align

if TYPE_CHECKING:
    from ..refusals import Refusal

NAMES: tuple[str, ...] = (
    # accept / peek / classify
    "accepted",  # connections accepted on any listener
    "accept_errors",  # accept() failures (out of descriptors: the listener pauses 100 ms)
    "connections_l4",  # connections piped raw to a backend (internal source, or listen.internal_l4)
    "connections_l7",  # connections terminated with PQ TLS for the L7 bridge (external source)
    "connections_http",  # connections on listen.http (:80, ACME challenges only)
    "peek_timeout",  # no complete ClientHello within limits.peek_timeout_s: FIN
    "peek_garbage",  # first bytes are not TLS, or the hello is malformed: closed (with the reference's alert)
    "peek_oversize",  # a ClientHello over limits.peek_max_bytes: illegal_parameter
    "peek_eof",  # the peer closed before its ClientHello was complete
    "no_sni",  # a ClientHello without server_name: its hello read, closed (L4), 421 (L7)
    "unknown_sni",  # a server name no mapping answers: its hello read, closed (L4), 421 (L7)
    "no_backend",  # a routed name whose service has no instance to pick (L4: its hello read, closed)
    "backend_connect_errors",  # failed connects to an instance (marked suspect, the next one tried), L4 and L7
    "all_suspect_fallback",  # picks made while every instance of the service was suspect (plain round-robin)
    "l4_bytes_in",  # bytes piped client -> backend on the L4 path
    "l4_bytes_out",  # bytes piped backend -> client on the L4 path
    # TLS
    "handshake_ok",  # completed client TLS handshakes (L7)
    "handshake_errors",  # failed client TLS handshakes (by reason: handshake_error_*)
    "handshake_timeout",  # handshakes over limits.handshake_timeout_s
    "tls_resumed",  # handshakes that resumed a session (a ticket from any worker of the fleet)
    "tls_alpn_refused",  # ALPN offered, nothing the edge speaks: no_application_protocol alert
    "peek_bad_version",  # record version major != 3: protocol_version alert, then close
    "cert_rejected",  # a store pair present but unusable (each worker counts the file versions it read)
    "cert_expiring",  # a certificate in use with less than 7 days left (once per certificate per worker)
    "connections_internal_l4",  # accepted on listen.internal_l4 and piped raw
    "internal_l4_refused",  # listen.internal_l4 from outside network.internal_cidrs (not allowed)
    # L7
    "requests",  # L7 requests answered
    "http_400",  # 400 Bad Request answered (malformed request, smuggling shape, bad body)
    "http_403",  # 403 answered (the WAF)
    "http_404",  # 404 answered (:80 outside ACME challenges)
    "http_421",  # 421 Misdirected Request (unknown name, Host disagrees with SNI, no SNI)
    "http_429",  # 429 answered (rate limit)
    "http_431",  # 431 answered (policy.max_headers, policy.max_header_bytes)
    "http_502",  # 502 answered (backend broken or refused its response)
    "http_503",  # 503 answered (no instance, caps, open breakers, WAF engine error)
    "http_504",  # 504 answered (upstream.response_timeout_s)
    "status_1xx",  # responses relayed by status class (the per-service rows have every code)
    "status_2xx",  # ... 2xx
    "status_3xx",  # ... 3xx
    "status_4xx",  # ... 4xx
    "status_5xx",  # ... 5xx
    "upstream_warm",  # L7 requests sent on a pooled upstream connection
    "upstream_cold",  # L7 requests that opened a new upstream connection
    "upstream_stale_retry",  # a pooled connection found closed, the request retried once (nothing was sent)
    "upstream_errors",  # upstream connections that broke before a complete response
    "upstream_timeout",  # no response byte within upstream.response_timeout_s: 504
    "slowloris_closed",  # request heads not complete within limits.header_timeout_s: closed
    "idle_closed",  # keep-alive connections idle past limits.idle_timeout_s: closed
    "drain_idle_closed",  # idle keep-alive connections closed by a draining worker after fleet.drain_idle_grace_s
    "websocket_upgrades",  # WebSocket tunnels opened (101 relayed)
    "acme_passthrough",  # not counted at present (its index is kept)
    "policy_waf",  # requests the WAF refused (403, or 400 for a body that claims a format and does not parse)
    "policy_rate_limit",  # requests over the rate limit (429)
    "policy_blocked",  # every policy block, all kinds (the sum of policy_block_*)
    "http_405",  # 405 answered (CONNECT is not served)
    "http_408",  # 408 Request Timeout answered
    "http_413",  # 413 answered (limits.max_request_body_bytes, policy.waf_body_max)
    "http_414",  # 414 answered (request target over the header caps)
    "http_501",  # 501 Not Implemented answered
    "http_505",  # 505 HTTP Version Not Supported answered
    "status_other",  # responses relayed whose status fits no class
    "acme_requests",  # ACME HTTP-01 challenges passed to acme.service
    "backpressure_client_paused",  # times reading the client paused because the backend could not take more
    "backpressure_upstream_paused",  # times reading the backend paused because the client could not take more
    "body_timeout",  # request bodies with no byte for limits.idle_timeout_s
    "bridge_errors",  # unexpected errors in an L7 callback: that connection aborted, the worker unharmed (a bug)
    "client_aborted",  # clients that went away before their response was complete
    "upstream_connect_failed",  # not counted at present (backend_connect_errors has it; the index is kept)
    "upstream_truncated",  # responses cut short by the backend (closed before their declared end)
    "upstream_unavailable",  # L7 requests for a service with no instance to pick: 503
    "websocket_bad_accept",  # a 101 without the Sec-WebSocket-Accept the client's key demands: 502
    # the HTTP edge (issue 16)
    "websocket_bad_upgrade",  # a 101 whose Upgrade is not exactly websocket, or without Connection: upgrade: 502
    "upgrade_refused",  # 400: a WebSocket handshake without one valid key, or an upgrade with a body
    "upgrade_ignored",  # an upgrade that is not a WebSocket handshake (h2c, HTTP/1.0, POST): served plainly
    "acme_not_challenge",  # under /.well-known/acme-challenge/ but not what a CA sends: normal path (:80: 404)
    "upstream_bad_status",  # a status line that is not HTTP/1.x with a 1xx-5xx code: 502
    "upstream_interim_refused",  # interim (1xx) responses over their count or bytes: 502
    "body_too_large",  # 413: a request body over limits.max_request_body_bytes (declared or streamed)
    "chunk_size_invalid",  # 400: a chunk size over 2^63 - 1
    # WAF (issue 12): inspections, refusals, and matched CRS rules by family (sentin8.crs.FAMILIES)
    "waf_inspected",  # requests the WAF inspected
    "waf_offloaded",  # inspections over 4 KiB run on the WAF's thread pool instead of the loop
    "waf_errors",  # WAF engine failures (a rule set that did not load): 503, fail closed
    "waf_body_too_large",  # bodies over policy.waf_body_max with waf_oversize = reject: 413
    "waf_log_suppressed",  # waf_block log lines dropped over the per-second log budget (still counted)
    "waf_engine_builds",  # rule sets loaded off the loop after a runtime change
    "waf_rule_method",  # matched CRS rules of family method (911)
    "waf_rule_scanner",  # ... scanner detection (913)
    "waf_rule_protocol",  # ... protocol enforcement (920)
    "waf_rule_protocol_attack",  # ... protocol attack (921)
    "waf_rule_multipart",  # ... multipart attack (922, CRS 4)
    "waf_rule_lfi",  # ... local file inclusion (930)
    "waf_rule_rfi",  # ... remote file inclusion (931)
    "waf_rule_rce",  # ... remote code execution (932)
    "waf_rule_php",  # ... PHP injection (933)
    "waf_rule_nodejs",  # CRS 3.3's 934 (NODEJS)
    "waf_rule_generic",  # CRS 4's 934 (GENERIC: Node.js, SSRF, prototype pollution, template injection...)
    "waf_rule_xss",  # ... cross-site scripting (941)
    "waf_rule_sqli",  # ... SQL injection (942)
    "waf_rule_session_fixation",  # ... session fixation (943)
    "waf_rule_java",  # ... Java attacks (944)
    "waf_rule_body_parse",  # a body that claims a format (form, JSON, XML, multipart) and does not parse
    "waf_rule_oversize",  # a value too long (or too costly) to inspect: sentin8.waf VALUE_MAX, RUN_MAX
    # caps and fail-fast (issue 12): every refusal by kind, and the breakers' transitions
    "refused_conn_cap_l7",  # external connections over limits.max_connections_per_ip: 503 + close
    "refused_conn_cap_l4",  # internal connections over limits.max_connections_per_ip: closed
    "refused_inflight",  # requests over limits.max_inflight_per_worker: 503 + Retry-After
    "refused_breaker_open",  # requests (L4: connections) for a service whose breakers are all open: 503 (closed)
    "breaker_skipped",  # instances passed over because their breaker was open
    "breaker_opened",  # breakers opened (breaker_open event)
    "breaker_closed",  # breakers closed by a successful probe (breaker_closed event)
    "unknown_counter",  # a name missing from this table: counted here rather than crash a connection
    "gauge_underflow",  # a gauge decremented below zero: a release without its acquire (a bug; tests assert 0)
    # traffic by source side (network.internal_cidrs): connections and L7 requests
    "traffic_external_connections",  # connections from outside network.internal_cidrs
    "traffic_internal_connections",  # connections from network.internal_cidrs
    "traffic_external_requests",  # L7 requests from external clients
    "traffic_internal_requests",  # L7 requests from internal clients
    # client TLS handshake failures by reason (WorkerCounters.handshake_error; sentin8.metrics.scales)
    "handshake_error_classical_only",  # the client offered no X25519MLKEM768 or no ML-DSA-65 (classical only)
    "handshake_error_timeout",  # over limits.handshake_timeout_s
    "handshake_error_protocol_version",  # not TLS 1.3
    "handshake_error_eof",  # the client closed mid-handshake
    "handshake_error_alpn",  # ALPN offered, nothing the edge speaks
    "handshake_error_protocol_error",  # any other handshake failure
    # refusals by policy, by kind (sentin8.refusals: the rule, and the refusals of each kind); their sum is
    # policy_blocked. Add a kind by adding a name here and a Refusal there.
    "policy_block_rate_limit",  # 429
    "policy_block_waf",  # the WAF's 403, 400 and 413
    "policy_block_header_caps",  # 431 and 414
    "policy_block_body_cap",  # over limits.max_request_body_bytes: 413
    "policy_block_conn_cap",  # over the per-client connection cap (limits)
    "policy_block_inflight_cap",  # over the worker's in-flight request cap: 503
    "policy_block_internal_l4_source",  # listen.internal_l4 from outside network.internal_cidrs
    "policy_block_other",  # a policy verdict of no other kind
    # gauges
    "l4_active",  # L4 pipes open
    "active_connections",  # L7 requests in flight: the drain signal
    "open_connections",
    # issue 17: L7 connections by client protocol (ALPN), and the h2 shell's refusals by reason
    "l7_connections_h1",  # external connections that speak HTTP/1.1 (no ALPN, or http/1.1 chosen)
    "l7_connections_h2",  # external connections that chose h2 by ALPN
    "h2_streams",  # HTTP/2 streams opened by clients
    "h2_stream_errors",  # a malformed request: RST_STREAM PROTOCOL_ERROR, never forwarded
    "h2_goaway_sent",  # GOAWAY frames sent (refusals, budgets, the final one of a drain)
    "h2_drain_goaway",  # the first GOAWAY of a two-step drain (last-stream-id 2^31-1, then a PING)
    *_H2_ENGINE_REASONS,  # the engine's refusals (sentin8/http/h2_events.py)
    *_H2_BUDGET_REASONS,  # the budgets' (h2_budget.py)
    *_H2_REQUEST_REASONS,  # malformed requests (h2_request.py)
    # the resolver's last-known table (issue 16): written by the resolver, in a counter block of its own
    "resolver_started_from_published",  # a resolver (re)start that continued from the table in shared memory
    "routing_cache_loaded",  # a cold start that began from the cache file in tls.state_dir (served stale)
    "routing_cache_invalid",  # a cache file found at a cold start but ignored: torn, foreign, another version
    "routing_cache_writes",  # complete, fresh tables written to the cache file
    "routing_cache_write_errors",  # a cache write that failed (full disk, permissions): routing unaffected
    # PROXY protocol v2 (issue 20: sentin8/proxy_protocol.py; refusals in sentin8/refusals.py). In: from
    # listen.proxy_protocol_from every connection starts with a header, else it is closed
    "proxy_header_ok",  # a PROXY header naming the client: its address is the client's for every decision
    "proxy_header_local",  # a LOCAL header (the balancer's health check), or one naming no IP client: the balancer's
    "proxy_header_missing",  # a trusted source whose connection does not start with a PROXY header
    "proxy_header_v1",  # a version 1 (text) header from a trusted source: only v2 is accepted
    "proxy_header_malformed",  # a v2 header the parser refuses (version, command, family, length, TLV, CRC32C)
    "proxy_header_oversize",  # a header announcing more than it may be (sentin8.proxy_protocol.MAX_BYTES)
    "proxy_header_truncated",  # the peer closed before its header was whole
    "proxy_header_timeout",  # the header not whole within limits.peek_timeout_s
    "proxy_header_untrusted",  # a PROXY header (v1 or v2) from outside listen.proxy_protocol_from
    "policy_block_proxy_source",  # the same, as a policy-block kind
    # out: an instance's proxy_protocol = "v2"
    "proxy_header_sent",  # L4 pipes that started with a PROXY v2 header to their backend
    # issue 17: h2 per-stream and per-block deadlines (workers/l7/h2/connection.py)
    "h2_header_timeout",  # a header block open past limits.header_timeout_s: GOAWAY ENHANCE_YOUR_CALM, closed
    "h2_body_timeout",  # a request body idle past limits.idle_timeout_s: that stream alone, 408 or RST_STREAM
    # response-side deadlines (limits.send_timeout_s): a client that takes no response bytes
    "send_timeout",  # HTTP/1.1 connections whose client took no response byte for limits.send_timeout_s: closed
    "h2_stream_send_timeout",  # h2 streams held by the client's windows past it: RST_STREAM CANCEL, upstream aborted
    "h2_send_timeout",  # h2 connections whose socket took nothing past it: GOAWAY, closed
    # a draining worker's HTTP/1.1 idle close (workers/l7/h1/connection.py)
    "drain_idle_spoke",  # the idle grace over with the client's bytes unread in the socket: read, not closed
)
GAUGES = ("l4_active", "active_connections", "open_connections")
MAX_COUNTERS = 256  # room for the names other features add; the last three words are the block's own
_PID = MAX_COUNTERS - 1  # pid of the process writing the block (0 = none): Prometheus reads its RSS
_EPOCH = MAX_COUNTERS - 2  # the max epoch the block's latency maxima belong to
_WORKER = MAX_COUNTERS - 3  # the writer's worker index + 1 (0 = none)
INDEX = {name: i for i, name in enumerate(NAMES)}
_UNKNOWN = INDEX["unknown_counter"]
_UNDERFLOW = INDEX["gauge_underflow"]
_STATUS_SLOT_OF = STATUS_SLOT_OF
_OTHER_STATUS_SLOT = OTHER_STATUS_SLOT
_BOUNDS_US = LATENCY_BOUNDS_US
_bisect = bisect.bisect_left
assert len(NAMES) <= _WORKER, "NAMES outgrew MAX_COUNTERS"
_GAUGE_INDEXES = frozenset(INDEX[g] for g in GAUGES)
_SKIP_FOLD = _GAUGE_INDEXES | {_PID, _EPOCH, _WORKER}  # belong to the live process, never folded

HANDSHAKE_PREFIX = "handshake_error_"
POLICY_PREFIX = "policy_block_"
TRAFFIC_NAMES = {
    (side, what): INDEX[f"traffic_{side}_{what}"]
    for side in ("external", "internal")
    for what in ("connections", "requests")
}


def _by_prefix(prefix: str) -> dict[str, int]:
    return {n.removeprefix(prefix): INDEX[n] for n in NAMES if n.startswith(prefix)}


HANDSHAKE_REASONS = _by_prefix(HANDSHAKE_PREFIX)  # reason -> word
L7_PROTOCOLS = {p: INDEX[f"l7_connections_{p}"] for p in ("h1", "h2")}  # L7 connections by ALPN's choice
# every HTTP/2 refusal: the engine's, the budgets', the request mapping's (each counted once by its reason)
H2_REFUSALS = {r: INDEX[r] for r in (*_H2_ENGINE_REASONS, *_H2_BUDGET_REASONS, *_H2_REQUEST_REASONS)}
POLICY_KINDS = _by_prefix(POLICY_PREFIX)  # kind -> word
_HS_OTHER = HANDSHAKE_REASONS["protocol_error"]

# One row per service index.
S_STATUS = 0  # STATUS_SLOTS words: requests by status slot (sentin8.metrics.scales.STATUS_LABELS)
S_LATENCY = S_STATUS + STATUS_SLOTS  # LATENCY_BUCKETS words, not cumulative
S_LAT_SUM_US = S_LATENCY + LATENCY_BUCKETS
S_LAT_MAX_US = S_LAT_SUM_US + 1  # the largest duration of the current max epoch (an interval's max)
S_WARM = S_LAT_MAX_US + 1
S_COLD = S_WARM + 1
S_STALE_RETRY = S_COLD + 1
S_L4 = S_STALE_RETRY + 1
# L4 bytes per service, counted when a pipe closes (as the fleet-wide l4_bytes_in/out): client -> backend, back
S_L4_BYTES_IN = S_L4 + 1
S_L4_BYTES_OUT = S_L4_BYTES_IN + 1
SERVICE_WORDS = align(S_L4_BYTES_OUT + 1, 8)
UPSTREAM_KINDS = {"warm": S_WARM, "cold": S_COLD, "stale_retry": S_STALE_RETRY}
# The fleet-wide latency histogram, as ``total()`` reports it (derived from the per-service rows, not stored):
# ``latency_le_<bound>ms`` per bucket, ``latency_le_inf``, and ``latency_sum_us``.
LATENCY_NAMES: tuple[str, ...] = (
    *(f"latency_le_{b * 1000:g}ms" for b in LATENCY_BOUNDS_S),
    "latency_le_inf",
    "latency_sum_us",
)
_UPSTREAM_BY_NAME = {  # name -> (fleet-wide word, offset in the service row)
    "upstream_warm": (INDEX["upstream_warm"], S_WARM),
    "upstream_cold": (INDEX["upstream_cold"], S_COLD),
    "upstream_stale_retry": (INDEX["upstream_stale_retry"], S_STALE_RETRY),
}
_L4_BYTES_IN, _L4_BYTES_OUT = INDEX["l4_bytes_in"], INDEX["l4_bytes_out"]
_TRAFFIC_EXTERNAL = {what: TRAFFIC_NAMES[("external", what)] for what in ("connections", "requests")}
_TRAFFIC_INTERNAL = {what: TRAFFIC_NAMES[("internal", what)] for what in ("connections", "requests")}

HEADER_WORDS = 8
H_FOLD_SEQ = 0  # odd while the supervisor folds a dead worker's block into the retired block
H_EPOCH = 1  # latency max epoch: the publisher bumps it after each document
H_DOC_SEQ = 2  # the publisher's document sequence number (continues across resolver restarts)
H_PUBLISH_FAILED = 3  # documents not published (Valkey unreachable)
H_PUBLISHED = 4  # documents published


def block_words(services: int) -> int:
    return align((MAX_COUNTERS + services * SERVICE_WORDS) * 8, CACHE_LINE) // 8


def region_bytes(slots: int, services: int) -> int:
    """``slots`` worker blocks + the retired block + the publisher's baseline block, after the header."""
    return HEADER_WORDS * 8 + (slots + 2) * block_words(services) * 8


def _block(view: memoryview, index: int, services: int) -> memoryview:
    n = block_words(services)
    start = HEADER_WORDS * 8 + index * n * 8
    return view[start : start + n * 8].cast("Q")


class WorkerCounters:
    """The writer's handle on its own block: every method is a few indexed word updates."""

    def __init__(self, view: memoryview, slot: int, services: int = 0) -> None:
        self.words = _block(view, slot, services)
        self._header = view[: HEADER_WORDS * 8].cast("Q")
        self.services = services

    def claim(self, worker: int = 0) -> None:
        """Called by the worker at start: zero its gauges, record its pid and index for readers."""
        self.zero_gauges()
        self.words[_WORKER] = worker + 1
        self.words[_PID] = os.getpid()

    def inc(self, name: str, n: int = 1) -> None:
        # .get on a local compiles to a method call; on the module global it made a bound method per update
        # (callgrind: ~1.1k -> ~0.8k instructions per inc)
        index = INDEX
        i = index.get(name, _UNKNOWN)
        self.words[i] = self.words[i] + n

    def add_gauge(self, name: str, delta: int) -> None:
        i = INDEX[name]
        value = self.words[i] + delta
        if value < 0:
            # Never hidden by a silent clamp: counted, so the fleet tests (and operators) see the bug.
            self.words[_UNDERFLOW] = self.words[_UNDERFLOW] + 1
            value = 0
        self.words[i] = value

    def zero_gauges(self) -> None:
        for i in _GAUGE_INDEXES:
            self.words[i] = 0

    # ---- per service: ``sidx`` is the route's service index (sentin8.shm.services) -----------------------

    def _row(self, sidx: int) -> int:
        if not 0 <= sidx < self.services:
            sidx = 1 if self.services > 1 else 0  # _other: never dropped, never out of the block
        return MAX_COUNTERS + sidx * SERVICE_WORDS

    def request(self, sidx: int, status: int, seconds: float) -> None:
        """One answered request: its status and its duration (request start -> last response byte).

        The hot path of the metrics (~0.5 µs): a handful of indexed word updates, lookups in lists and a
        C bisect; no string, no dict, no allocation but the ints."""
        if not 0 <= sidx < self.services:
            if not self.services:
                return
            sidx = 1 if self.services > 1 else 0  # _other
        w = self.words
        row = MAX_COUNTERS + sidx * SERVICE_WORDS
        i = row + (_STATUS_SLOT_OF[status] if 0 <= status < 600 else _OTHER_STATUS_SLOT)
        w[i] += 1
        us = int(seconds * 1e6) if seconds > 0 else 0
        i = row + S_LATENCY + _bisect(_BOUNDS_US, us)
        w[i] += 1
        w[row + S_LAT_SUM_US] += us
        epoch = self._header[H_EPOCH]
        if w[_EPOCH] != epoch:  # a new interval: the maxima of the last one were published
            for s in range(self.services):
                w[MAX_COUNTERS + s * SERVICE_WORDS + S_LAT_MAX_US] = 0
            w[_EPOCH] = epoch
        i = row + S_LAT_MAX_US
        if us > w[i]:
            w[i] = us

    def upstream(self, sidx: int, name: str) -> None:
        """``upstream_warm`` | ``upstream_cold`` | ``upstream_stale_retry``: the fleet-wide name and the service's."""
        by_name = _UPSTREAM_BY_NAME  # a local, as in inc
        got = by_name.get(name)
        if got is None:
            self.inc(name)
            return
        index, offset = got
        w = self.words
        w[index] += 1
        if self.services:
            w[self._row(sidx) + offset] += 1

    def l4_connection(self, sidx: int) -> None:
        if self.services:
            i = self._row(sidx) + S_L4
            self.words[i] = self.words[i] + 1

    def l4_closed(self, sidx: int, bytes_in: int, bytes_out: int) -> None:
        """A pipe of service ``sidx`` closed: its bytes each way, fleet-wide and in the service's row."""
        w = self.words
        w[_L4_BYTES_IN] += bytes_in
        w[_L4_BYTES_OUT] += bytes_out
        if self.services:
            row = self._row(sidx)
            w[row + S_L4_BYTES_IN] += bytes_in
            w[row + S_L4_BYTES_OUT] += bytes_out

    # ---- fleet-wide, by reason or kind: one call each for the features that count them ---------------

    def handshake_error(self, reason: str) -> None:
        """A failed client TLS handshake; ``reason`` from ``sentin8.metrics.scales.handshake_reason``."""
        i = HANDSHAKE_REASONS.get(reason, _HS_OTHER)
        self.words[i] = self.words[i] + 1

    def refused(self, refusal: Refusal) -> None:
        """A connection or request refused, counted as ``sentin8.refusals`` decides (its name; a policy block
        also by kind and in ``policy_blocked``): the words were resolved when the refusal was defined."""
        w = self.words
        for i in refusal.words:
            w[i] += 1

    def traffic(self, external: bool, what: str = "connections") -> None:
        """A connection or an L7 request (``what``), by source side."""
        i = (_TRAFFIC_EXTERNAL if external else _TRAFFIC_INTERNAL)[what]
        self.words[i] += 1


class CounterReader:
    def __init__(
        self, view: memoryview, slots: int, services: int = 0, names_in_use: Callable[[], int] | None = None
    ) -> None:
        self._names_in_use = names_in_use  # ServiceNames.count: rows past it are all zero, skip them
        self._view = view
        self._header = view[: HEADER_WORDS * 8].cast("Q")
        self.slots = slots
        self.services = services
        self.retired_index = slots
        self.baseline_index = slots + 1

    def _words(self, index: int) -> memoryview:
        return _block(self._view, index, self.services)

    def block(self, slot: int) -> dict[str, int]:
        w = self._words(slot)
        return {name: w[i] for i, name in enumerate(NAMES)}

    def writers(self) -> list[tuple[int, int]]:
        """(worker index, pid) of every block with a live writer (the supervisor clears a block at reap)."""
        out = []
        for slot in range(self.slots):
            w = self._words(slot)
            pid = w[_PID]
            if pid:
                out.append((w[_WORKER] - 1, pid))
        return out

    def header(self, word: int) -> int:
        return self._header[word]

    def set_header(self, word: int, value: int) -> None:
        """Header words the publisher owns (epoch, document sequence, publish counts)."""
        self._header[word] = value

    def total(self) -> dict[str, int]:
        """Fleet-wide names summed over live blocks and the retired block (``SIGUSR1`` stats, /health), plus
        the fleet-wide latency histogram (``LATENCY_NAMES``) summed over every service's."""
        words = self.read()
        out = {name: words[i] for i, name in enumerate(NAMES)}
        hist = [0] * (LATENCY_BUCKETS + 1)  # the buckets, then the sum
        for start in range(MAX_COUNTERS, len(words), SERVICE_WORDS):
            for b in range(LATENCY_BUCKETS + 1):
                hist[b] += words[start + S_LATENCY + b]
        out.update(zip(LATENCY_NAMES, hist, strict=True))
        return out

    def read(self, used_services: int | None = None) -> list[int]:
        """Every word (fleet-wide + the first ``used_services`` rows; default: the rows of every service
        named so far) summed over live + retired blocks, retried while a fold runs so nothing is counted
        twice or missed. Latency maxima are the max over the blocks of the current epoch, not a sum."""
        if used_services is None:
            used_services = self._names_in_use() if self._names_in_use is not None else self.services
        used = min(used_services, self.services)
        n = MAX_COUNTERS + used * SERVICE_WORDS
        max_offsets = [MAX_COUNTERS + s * SERVICE_WORDS + S_LAT_MAX_US for s in range(used)]
        for _ in range(1000):
            seq = self._header[H_FOLD_SEQ]
            if seq & 1:
                time.sleep(0.001)
                continue
            epoch = self._header[H_EPOCH]
            total = [0] * n
            for index in range(self.slots + 1):
                block = self._words(index)[:n].tolist()
                if not any(block):
                    continue
                total = [a + b for a, b in zip(total, block, strict=True)]
            # maxima: not summed but the largest of this epoch
            for off in max_offsets:
                total[off] = 0
            for index in range(self.slots + 1):
                w = self._words(index)
                if w[_EPOCH] != epoch:
                    continue
                for off in max_offsets:
                    if w[off] > total[off]:
                        total[off] = w[off]
            if self._header[H_FOLD_SEQ] == seq:
                return total
        raise RuntimeError("counters: a fold never finished (supervisor stuck?)")

    def baseline(self, used_services: int) -> list[int]:
        n = MAX_COUNTERS + min(used_services, self.services) * SERVICE_WORDS
        return self._words(self.baseline_index)[:n].tolist()

    def set_baseline(self, words: list[int]) -> None:
        """The publisher records what its last document covered (survives a resolver restart)."""
        w = self._words(self.baseline_index)
        for i, v in enumerate(words):
            w[i] = v

    def zero_gauges(self, slot: int) -> None:
        w = self._words(slot)
        for i in _GAUGE_INDEXES:
            w[i] = 0

    def retire(self, slot: int) -> None:
        """Fold a dead worker's block into the retired block and zero it (the supervisor, at reap).

        Only the supervisor calls this, after the writer is gone: the slot has no writer during the fold.
        """
        w = self._words(slot)
        r = self._words(self.retired_index)
        h = self._header
        epoch = h[H_EPOCH]
        h[H_FOLD_SEQ] = h[H_FOLD_SEQ] + 1  # odd: readers retry
        try:
            if r[_EPOCH] != epoch:
                for s in range(self.services):
                    r[MAX_COUNTERS + s * SERVICE_WORDS + S_LAT_MAX_US] = 0
                r[_EPOCH] = epoch
            same_epoch = w[_EPOCH] == epoch
            for i in range(len(w)):
                v = w[i]
                if not v or i in _SKIP_FOLD:
                    continue
                if i >= MAX_COUNTERS and (i - MAX_COUNTERS) % SERVICE_WORDS == S_LAT_MAX_US:
                    if same_epoch and v > r[i]:
                        r[i] = v
                else:
                    r[i] = r[i] + v
            for i in range(len(w)):
                if w[i]:
                    w[i] = 0
        finally:
            h[H_FOLD_SEQ] = h[H_FOLD_SEQ] + 1
