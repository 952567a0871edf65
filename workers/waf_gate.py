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
        self._build: tuple | None = None  # (values object, waiters) of the engine being built off the loop
        self._log_window = 0.0
        self._logged = 0

    def enabled(self) -> bool:
        return self.policy.cfg.waf

    def when_ready(self, done: Callable[[WafEngine | BaseException | None], None]) -> None:
        """Call ``done`` with the engine for the current settings: at once when it is built (the usual case),
        else once a thread has built it (a runtime change: loading the rules takes ~0.1 s, which the loop does
        not wait for). None when the WAF is off; the exception when the rules do not load."""
        policy = self.policy
        cfg = policy.cfg
        if not cfg.waf:
            done(None)
            return
        engine = policy.ready_engine(cfg)
        if engine is not None:
            done(engine)
            return
        build = self._build
        if build is None or build[0] is not cfg:
            waiters: list[Callable[[WafEngine | BaseException | None], None]] = []
            self._build = build = (cfg, waiters)
            self.count("waf_engine_builds", 1)
            fut = self.loop.run_in_executor(self._executor(), policy.waf_engine, cfg)
            fut.add_done_callback(lambda f, b=build: self._built(f, b))
        build[1].append(done)

    def _built(self, fut: asyncio.Future, build: tuple) -> None:
        if self._build is build:
            self._build = None
        result = fut.exception() if not fut.cancelled() else RuntimeError("WAF engine build cancelled")
        for done in build[1]:
            done(result if result is not None else fut.result())

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="waf")
        return self._pool

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
        self.count("waf_offloaded", 1)
        fut = self.loop.run_in_executor(self._executor(), engine.inspect, req)
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
