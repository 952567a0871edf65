"""Edge policy per request, after ACME passthrough: rate limit (429), then the WAF (403). Sans-IO but for the
shared bucket table it is handed and the WAF engine it loads.

Every policy value (on/off, rate, burst, key, WAF settings) is read from ``self.cfg`` at decision time, in this
one place, so a runtime overlay (the management API) only has to replace or update that object: a changed WAF
setting builds a new engine on the next request that needs one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from . import refusals, tokenbucket
from .cluster.bucket_merge import fallback_limits
from .config import Policy
from .refusals import Refusal
from .shm.ratelimit import BucketTable
from .waf import WafEngine, WafSettings, settings_from_policy

Header = tuple[bytes, bytes]


class Verdict:
    """A refusal: the status to answer, what it counts as (a ``sentin8.refusals.Refusal``, counted by the bridge
    that answers it), and headers for the answer.

    ``keep_alive`` says the connection may serve the client's next request (a 429 must not cost a well-behaved
    client a new TLS handshake); other refusals close it.
    """

    __slots__ = ("headers", "keep_alive", "refusal", "status")

    def __init__(
        self, status: int, refusal: Refusal, headers: list[Header] | None = None, keep_alive: bool = False
    ) -> None:
        self.status = status
        self.refusal = refusal
        self.headers = headers or []
        self.keep_alive = keep_alive

    @property
    def counter(self) -> str | None:
        """The refusal's own counter name."""
        return self.refusal.name

    def __repr__(self) -> str:
        return f"Verdict({self.status}, {self.refusal!r})"


def rate_limit_key(kind: str, client_ip: str, host: str) -> str:
    """The bucket a request draws from: per client address, per address and host, or per host (domain)."""
    if kind == "ip":
        return client_ip
    if kind == "host":
        return "|" + host  # "|" never starts an address: the two kinds cannot share a bucket
    return f"{client_ip}|{host}"


def rate_limit_headers(rate: float, tokens_u: int) -> list[Header]:
    """``Retry-After`` (seconds until one token) and the IETF draft's ``RateLimit-Policy`` / ``RateLimit``.

    draft-ietf-httpapi-ratelimit-headers: the policy is a quota ``q`` per window ``w`` seconds (the refill rate
    per second, rounded down, at least 1); ``r`` is what remains now (whole tokens), ``t`` the seconds until the
    next request is admitted.
    """
    retry = tokenbucket.retry_after_s(tokens_u, rate)
    quota = max(1, int(rate))
    return [
        (b"Retry-After", b"%d" % retry),
        (b"RateLimit-Policy", b'"edge";q=%d;w=1' % quota),
        (b"RateLimit", b'"edge";r=%d;t=%d' % (tokens_u // tokenbucket.UNIT, retry)),
    ]


class EdgePolicy:
    def __init__(
        self,
        cfg: Policy,
        buckets: BucketTable | None,
        clock: Callable[[], float] = time.time,
        share: Callable[[], int] | None = None,
    ) -> None:
        """``share``: in cluster mode, what the limit is divided by right now (1 = all of it; more while Valkey is
        unreachable and ``cluster.fallback = "share"``), read from shared memory on each rate-limited request."""
        self.cfg = cfg
        self.buckets = buckets
        self.clock = clock
        self.share = share
        self._engine: WafEngine | None = None
        self._engine_cfg: Policy | None = None  # the values object the engine was last checked against
        self._engine_lock = threading.Lock()

    def _clock_us(self) -> int:
        return int(self.clock() * 1e6)

    def rate_limit(self, client_ip: str, host: str) -> Verdict | None:
        """None to admit, else a 429 that keeps the connection."""
        cfg = self.cfg
        if not cfg.rate_limit or self.buckets is None:
            return None
        key = rate_limit_key(cfg.rate_limit_key, client_ip, host)
        rate, burst = cfg.rate_limit_rps, cfg.rate_limit_burst
        if self.share is not None:
            hosts = self.share()
            if hosts > 1:
                rate, burst = fallback_limits(rate, burst, "share", hosts)
        ok, tokens_u, _ = self.buckets.decide(key, self._clock_us, rate, burst)
        if ok:
            return None
        return Verdict(429, refusals.RATE_LIMIT, rate_limit_headers(rate, tokens_u), keep_alive=True)

    def check(self, client_ip: str, host: str, target: bytes) -> Verdict | None:
        """The decisions made on the request head alone (the WAF waits for the body: ``waf_engine``)."""
        return self.rate_limit(client_ip, host)

    def waf_engine(self, cfg: Policy | None = None) -> WafEngine | None:
        """The engine for ``cfg`` (default: the current values) when the WAF is on, else None. Built (~0.1 s)
        when the settings are new; raises ``WafLoadError`` when the rules do not load. Thread-safe."""
        cfg = cfg or self.cfg
        if not cfg.waf:
            return None
        engine = self.ready_engine(cfg)
        if engine is not None:
            return engine
        settings: WafSettings = settings_from_policy(cfg)
        engine = self._engine
        if engine is None or engine.settings != settings:
            with self._engine_lock:
                engine = self._engine
                if engine is None or engine.settings != settings:
                    engine = self._engine = WafEngine(settings)
        self._engine_cfg = cfg
        return engine

    def ready_engine(self, cfg: Policy | None = None) -> WafEngine | None:
        """The engine for ``cfg`` if it is built already, else None (never builds: cheap, for the loop)."""
        cfg = cfg or self.cfg
        engine = self._engine
        if engine is None:
            return None
        if cfg is self._engine_cfg:
            return engine  # the same values object as last time (a runtime change replaces it): nothing to compare
        if engine.settings == settings_from_policy(cfg):
            self._engine_cfg = cfg
            return engine
        return None
