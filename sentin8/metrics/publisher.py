"""The ``stat:metrics`` publisher: every ``metrics.interval_s``, one JSON document of deltas on Valkey.

Runs as a task in the resolver process (which already speaks to Valkey), never in a worker: workers only
increment shared words, so a slow or absent Valkey can never block or slow the data path. A failed PUBLISH
is skipped and counted (``H_PUBLISH_FAILED``); the baseline does not move, so the next document carries
the missed deltas and sums stay exact. The baseline and the sequence number live in shared memory, so a
respawned resolver continues where the last one stopped instead of re-sending everything since boot.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from typing import Any

from .. import valkey_client
from ..config import ValkeyTarget
from ..eventlog import event
from ..shm import counters as c
from ..shm.counters import CounterReader
from ..shm.services import ServiceNames
from . import document


class MetricsPublisher:
    def __init__(
        self,
        reader: CounterReader,
        names: ServiceNames,
        target: ValkeyTarget | str,
        channel: str,
        interval_s: float,
        *,
        client: Any = None,
    ) -> None:
        self.reader = reader
        self.names = names
        self.target = ValkeyTarget(target) if isinstance(target, str) else target  # a str: one server's URL
        self.channel = channel
        self.interval_s = interval_s
        self.timeout_s = max(0.5, min(5.0, interval_s / 2))
        self._client = client
        self.host = socket.gethostname()
        self.version = document.package_version()
        self._failing = False

    def _valkey(self) -> Any:
        if self._client is None:
            # no client-side retry: a failure shows at once; the next interval is the retry
            self._client = valkey_client.connect(
                self.target, connect_timeout_s=self.timeout_s, timeout_s=self.timeout_s
            )
        return self._client

    def next_document(self) -> tuple[dict[str, Any], list[int]]:
        """The document the next publish sends, and the reading it covers (the next baseline)."""
        names = self.names.names()
        now = self.reader.read(len(names))
        before = self.reader.baseline(len(names))
        doc = document.build(
            now,
            before,
            names,
            seq=self.reader.header(c.H_DOC_SEQ) + 1,
            interval_s=self.interval_s,
            host=self.host,
            pid=os.getpid(),
            version=self.version,
        )
        return doc, now

    async def publish_once(self) -> bool:
        doc, now = self.next_document()
        payload = json.dumps(doc, separators=(",", ":"))
        try:
            await asyncio.wait_for(self._valkey().publish(self.channel, payload), self.timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            r = self.reader
            r.set_header(c.H_PUBLISH_FAILED, r.header(c.H_PUBLISH_FAILED) + 1)
            if not self._failing:  # transitions, not every interval
                self._failing = True
                event("metrics_publish_failed", "warning", channel=self.channel, error=type(exc).__name__)
            return False
        r = self.reader
        r.set_baseline(now)
        r.set_header(c.H_DOC_SEQ, doc["seq"])
        r.set_header(c.H_PUBLISHED, r.header(c.H_PUBLISHED) + 1)
        r.set_header(c.H_EPOCH, r.header(c.H_EPOCH) + 1)  # latency maxima start over for the next interval
        if self._failing:
            self._failing = False
            event("metrics_publish_recovered", channel=self.channel, seq=doc["seq"])
        return True

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        event("metrics_publisher_start", channel=self.channel, interval_s=self.interval_s)
        due = loop.time()
        try:
            while True:
                due += self.interval_s
                await asyncio.sleep(max(0.0, due - loop.time()))
                try:
                    await self.publish_once()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # a bug here must cost one document, not every later one
                    event("metrics_publish_error", "error", error=type(exc).__name__, detail=str(exc)[:200])
                if loop.time() > due + self.interval_s:  # fell behind (a long outage): do not burst
                    due = loop.time()
        finally:
            client, self._client = self._client, None
            await valkey_client.close(client)
