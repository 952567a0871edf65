"""What each refusal of the edge counts as: one table and one rule, for every path that refuses.

A refusal is counted under its own name (``refused_inflight``, ``policy_waf``, ...) when it has one. When it is
a **policy block** (the edge refusing by one of its own rules: the rate, the WAF, a cap on the head or on
connections or requests, the sources a port admits), it is also counted under ``policy_block_<kind>`` and in the
total ``policy_blocked``. A malformed request or ClientHello (400, a peek refusal), a name the edge does not
route (421, an unknown SNI) or a backend that cannot answer (502, 503, an open breaker) is no policy block: the
client broke no rule of the edge's, and those keep their own counters.

``counted_as`` is that rule, and ``Refusal`` resolves it once, where the refusal is defined, to the counter words
it adds; every refusal path counts through ``WorkerCounters.refused`` (``L7Context.refused`` in the bridge). So
``policy_blocked`` is the sum of the kinds by construction, and a new refusal is one line here
(ARCHITECTURE.md §7, "A refusal").
"""

from __future__ import annotations

from .shm.counters import INDEX, POLICY_KINDS, POLICY_PREFIX

POLICY_TOTAL = "policy_blocked"


def counted_as(name: str | None, kind: str | None) -> tuple[str, ...]:
    """The counter names one refusal adds to: its own name, then for a policy block its kind and the total.

    Like ``WorkerCounters.inc``, an unknown name counts as ``unknown_counter`` and an unknown kind as
    ``other``, so a typo shows in the counters instead of raising on a connection."""
    names = []
    if name is not None:
        names.append(name if name in INDEX else "unknown_counter")
    if kind is not None:
        names.append(POLICY_PREFIX + (kind if kind in POLICY_KINDS else "other"))
        names.append(POLICY_TOTAL)
    return tuple(names)


class Refusal:
    """One way the edge refuses, and the counter words it adds (``counted_as``, resolved once)."""

    __slots__ = ("kind", "name", "names", "words")

    def __init__(self, name: str | None, kind: str | None) -> None:
        self.name = name  # its own counter, or None when its status counter says it all (431, 414)
        self.kind = kind  # the policy-block kind, or None: not a policy block
        self.names = counted_as(name, kind)
        self.words = tuple(INDEX[n] for n in self.names)

    def __repr__(self) -> str:
        return f"Refusal({self.name!r}, {self.kind!r})"


# Policy blocks.
RATE_LIMIT = Refusal("policy_rate_limit", "rate_limit")  # 429, keep-alive (EdgePolicy.rate_limit)
WAF = Refusal("policy_waf", "waf")  # 403, or 400 for a body that claims a format and does not parse
WAF_BODY_TOO_LARGE = Refusal("waf_body_too_large", "waf")  # 413: a body the WAF cannot inspect whole
BODY_CAP = Refusal("body_too_large", "body_cap")  # 413: over limits.max_request_body_bytes (declared or streamed)
HEADER_CAPS = Refusal(None, "header_caps")  # 431 (policy.max_headers, max_header_bytes), 414 (the same cap)
CONN_CAP_L7 = Refusal("refused_conn_cap_l7", "conn_cap")  # limits.max_connections_per_ip: 503 + close
CONN_CAP_L4 = Refusal("refused_conn_cap_l4", "conn_cap")  # the same cap on the L4 path: closed
INFLIGHT_CAP = Refusal("refused_inflight", "inflight_cap")  # limits.max_inflight_per_worker: 503
INTERNAL_L4_SOURCE = Refusal("internal_l4_refused", "internal_l4_source")  # listen.internal_l4 from outside
POLICY_OTHER = Refusal(None, "other")  # a policy verdict given as a bare status (a hook that only has one)
PROXY_UNTRUSTED = Refusal("proxy_header_untrusted", "proxy_source")  # from outside listen.proxy_protocol_from
# Refusals that are not policy blocks (counted by name only).
BREAKER_OPEN = Refusal("refused_breaker_open", None)  # every instance's breaker open: 503 (L4: closed)
# A trusted balancer's connection that does not start with a well-formed PROXY v2 header: closed, no answer.
PROXY_MISSING = Refusal("proxy_header_missing", None)
PROXY_V1 = Refusal("proxy_header_v1", None)
PROXY_MALFORMED = Refusal("proxy_header_malformed", None)
PROXY_OVERSIZE = Refusal("proxy_header_oversize", None)
PROXY_TRUNCATED = Refusal("proxy_header_truncated", None)
PROXY_TIMEOUT = Refusal("proxy_header_timeout", None)

ALL: tuple[Refusal, ...] = (
    RATE_LIMIT,
    WAF,
    WAF_BODY_TOO_LARGE,
    BODY_CAP,
    HEADER_CAPS,
    CONN_CAP_L7,
    CONN_CAP_L4,
    INFLIGHT_CAP,
    INTERNAL_L4_SOURCE,
    POLICY_OTHER,
    PROXY_UNTRUSTED,
    BREAKER_OPEN,
    PROXY_MISSING,
    PROXY_V1,
    PROXY_MALFORMED,
    PROXY_OVERSIZE,
    PROXY_TRUNCATED,
    PROXY_TIMEOUT,
)

_HEAD_CAPS = {431: HEADER_CAPS, 414: HEADER_CAPS}


_PROXY_ERRORS = {"not_proxy": PROXY_MISSING, "v1": PROXY_V1, "oversize": PROXY_OVERSIZE}


def for_proxy_error(reason: str) -> Refusal:
    """What a trusted source's refused PROXY header counts as, by ``ProxyProtocolError.reason``: no header at
    all, a v1 header and an oversized one by name, every other defect as malformed."""
    return _PROXY_ERRORS.get(reason, PROXY_MALFORMED)


def for_head_status(status: int) -> Refusal | None:
    """What a request refused while its head was read counts as: the caps (431, 414) are policy blocks; a
    malformed head (400, 405, 505 ...) is none."""
    return _HEAD_CAPS.get(status)
