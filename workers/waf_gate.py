"""The WAF's I/O shell in a worker: where an inspection runs, and what is counted and logged about it.

The engine releases the GIL while it works (``sentin8.waf``), so an inspection on a thread leaves the event loop
free for every other connection of the worker. A thread hop costs tens of µs, so small requests (target,
headers and body under ``INLINE_MAX`` bytes: bounded by the PCRE match limits to ~1-2 ms) are inspected on the
loop; anything bigger goes to a small pool. Matched rule ids are counted by family and logged (ids, never the
payload); a log line per block is capped so a flood of attacks cannot flood stderr.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from sentin8.eventlog import event
from sentin8.policy import EdgePolicy
from sentin8.waf import WafEngine, WafRequest, WafVerdict

INLINE_MAX = 4096  # bytes of target + headers + body inspected on the loop itself
THREADS = 2  # inspections at once per worker, off the loop
LOG_PER_S = 50  # block lines per second per worker; the rest are counted as waf_log_suppressed


class WafGate:
    def __init__(self, loop: asyncio.AbstractEventLoop, policy: EdgePolicy, count: Callable[[str, int], None]) -> None:
        self.loop = loop
        self.policy = policy
        self.count = count
        self._pool: ThreadPoolExecutor | None = None
        self._log_window = 0.0
        self._logged = 0

    def engine(self) -> WafEngine | None:
        return self.policy.waf_engine()

    def inspect(
        self, engine: WafEngine, req: WafRequest, size: int, done: Callable[[WafVerdict | BaseException], None]
    ) -> None:
        """Run one inspection; ``done`` gets the verdict (or the exception) on the loop."""
        if size <= INLINE_MAX:
            try:
                result: WafVerdict | BaseException = engine.inspect(req)
            except Exception as exc:
                result = exc
            done(result)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="waf")
        self.count("waf_offloaded", 1)
        fut = self.loop.run_in_executor(self._pool, engine.inspect, req)
        fut.add_done_callback(lambda f: None if f.cancelled() else done(f.exception() or f.result()))

    def report(self, verdict: WafVerdict, service: str, correlation_id: bytes) -> None:
        """Counters for every inspection with a match; one log line per block (rule ids, never the payload)."""
        count = self.count
        count("waf_inspected", 1)
        for fam in verdict.families:
            count(f"waf_rule_{fam}", 1)
        if not verdict.blocked:
            return
        now = time.monotonic()
        if now - self._log_window >= 1.0:
            self._log_window, self._logged = now, 0
        if self._logged >= LOG_PER_S:
            count("waf_log_suppressed", 1)
            return
        self._logged += 1
        event(
            "waf_block",
            "warning",
            status=verdict.status,
            rule_ids=list(verdict.rule_ids),
            families=list(verdict.families),
            service=service,
            correlation_id=correlation_id.decode("ascii", "replace"),
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
