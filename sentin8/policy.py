"""Edge policy per request, after ACME passthrough: rate limit (429), then WAF (403). Sans-IO but for the
shared bucket table it is handed."""

from __future__ import annotations

import time
from collections.abc import Callable

from . import waf
from .config import Policy
from .shm.ratelimit import BucketTable


class EdgePolicy:
    def __init__(self, cfg: Policy, buckets: BucketTable | None, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.buckets = buckets
        self.clock = clock

    def check(self, client_ip: str, host: str, target: bytes) -> tuple[int, str] | None:
        """None to let the request through, else (status, counter name)."""
        cfg = self.cfg
        if cfg.rate_limit and self.buckets is not None:
            key = client_ip if cfg.rate_limit_key == "ip" else f"{client_ip}|{host}"
            now_us = int(self.clock() * 1e6)
            if not self.buckets.admit(key, now_us, cfg.rate_limit_rps, cfg.rate_limit_burst):
                return 429, "policy_rate_limit"
        if cfg.waf and waf.inspect(target) is not None:
            return 403, "policy_waf"
        return None
