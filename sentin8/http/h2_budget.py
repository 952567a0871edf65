"""HTTP/2 attack budgets the engine does not enforce, sans-IO: one ``StreamBudget`` per client connection.

The engine (sentin8/http/h2_engine.py) already bounds CONTINUATION frames, header lists, unsent ACKs, RST_STREAM
and "glitch" rates, and answers a zero WINDOW_UPDATE with PROTOCOL_ERROR. What is left, and decided here:

- **Concurrency counted until the exchange is done** (HAProxy's rule): a stream holds its place under
  ``max_concurrent`` from its request until the shell says ``done`` — not until its RST_STREAM, which is what
  Rapid Reset (CVE-2023-44487) and MadeYouReset (CVE-2025-8671) exploit: the client (or a frame that makes
  *us* reset) frees the engine's slot while the upstream work goes on. At the cap the shell stops reading
  (``at_cap``); a stream beyond it is refused (REFUSED_STREAM, never processed, the client may retry).
- **New streams per read** (nginx): more than ``2 x max_concurrent`` in one read are refused.
- **Premature resets** (Envoy): once ``reset_min_streams`` streams have closed, if more than half of them were
  reset (by the client, by a stream error it provoked, or refused) within ``reset_window_s`` of opening,
  the connection goes: GOAWAY ENHANCE_YOUR_CALM.
- **Streams per connection** (nginx ``keepalive_requests``): the ``max_streams``-th stream is served, then
  GOAWAY NO_ERROR; later ones are refused.
- **Traffic** (nginx): close when the bytes read / 8 exceed the useful bytes (DATA both ways) + 1 MiB: every
  frame that does no work (PING, SETTINGS, WINDOW_UPDATE, PRIORITY, empty DATA, unknown types, padding) costs.
- **Control frames** (Envoy's ratios): PING, SETTINGS, WINDOW_UPDATE and PRIORITY_UPDATE frames beyond
  ``control_base`` + ``control_per_work`` per unit of work (a stream opened, or 16 KiB of DATA either way).

Each method returns ``None`` (go on) or a ``Verdict``: what to do and the counter to count.
"""

from __future__ import annotations

from .h2_codes import ENHANCE_YOUR_CALM, NO_ERROR, REFUSED_STREAM
from .h2_limits import H2Limits

_D = H2Limits()  # the defaults (the [http2] keys'), for a budget made without a config

REFUSE = 1  # reset this stream with ``code`` (REFUSED_STREAM), keep the connection
GOAWAY = 2  # serve this stream, then a graceful final GOAWAY ``code`` (NO_ERROR)
CLOSE = 3  # close the connection now: GOAWAY ``code`` (ENHANCE_YOUR_CALM), nothing more served


class Verdict:
    """An instruction for the shell. Shared instances: read, never write."""

    __slots__ = ("action", "code", "counter")

    def __init__(self, action: int, counter: str, code: int) -> None:
        self.action = action
        self.counter = counter
        self.code = code

    def __repr__(self) -> str:
        return f"Verdict({self.counter})"


REFUSED_AT_CAP = Verdict(REFUSE, "h2_refused_at_cap", REFUSED_STREAM)
REFUSED_BURST = Verdict(REFUSE, "h2_refused_burst", REFUSED_STREAM)
REFUSED_AFTER_LAST = Verdict(REFUSE, "h2_refused_after_last", REFUSED_STREAM)
LAST_STREAM = Verdict(GOAWAY, "h2_goaway_max_streams", NO_ERROR)
PREMATURE_RESETS = Verdict(CLOSE, "h2_premature_resets", ENHANCE_YOUR_CALM)
TRAFFIC_FLOOD = Verdict(CLOSE, "h2_traffic_flood", ENHANCE_YOUR_CALM)
CONTROL_FLOOD = Verdict(CLOSE, "h2_control_flood", ENHANCE_YOUR_CALM)

REASONS: tuple[str, ...] = tuple(
    v.counter
    for v in (
        REFUSED_AT_CAP,
        REFUSED_BURST,
        REFUSED_AFTER_LAST,
        LAST_STREAM,
        PREMATURE_RESETS,
        TRAFFIC_FLOOD,
        CONTROL_FLOOD,
    )
)

_WORK_BYTES = 16384  # one DATA frame's worth of payload is one unit of work for the control-frame ratio


class StreamBudget:
    """The per-connection counts. ``now`` is a monotonic time in seconds, given by the shell."""

    __slots__ = (
        "_opened_at",
        "active",
        "closed",
        "control_base",
        "control_per_work",
        "max_concurrent",
        "max_per_read",
        "max_streams",
        "new_in_read",
        "premature",
        "reset_min_streams",
        "reset_window_s",
        "total",
        "traffic_allowance",
    )

    def __init__(
        self,
        *,
        max_concurrent: int = _D.max_concurrent_streams,
        max_streams: int = _D.max_streams,
        reset_min_streams: int = _D.reset_min_streams,
        reset_window_s: float = _D.reset_window_s,
        traffic_allowance: int = 1 << 20,
        control_base: int = 1000,
        control_per_work: int = 10,
    ) -> None:
        self.max_concurrent = max_concurrent
        self.max_per_read = 2 * max_concurrent
        self.max_streams = max_streams
        self.reset_min_streams = reset_min_streams
        self.reset_window_s = reset_window_s
        self.traffic_allowance = traffic_allowance
        self.control_base = control_base
        self.control_per_work = control_per_work
        self._opened_at: dict[int, float] = {}  # streams whose exchange is not done -> when they opened
        self.active = 0  # streams holding a place: opened, exchange not done (resets do not free it)
        self.total = 0  # streams accepted over the connection's life
        self.closed = 0  # streams that ended (done, reset, or refused)
        self.premature = 0  # ... of which within reset_window_s of opening, by a reset or a refusal
        self.new_in_read = 0

    @classmethod
    def of(cls, limits: H2Limits) -> StreamBudget:
        """The budget of a connection with ``limits`` (``H2Limits.from_config``: the ``[http2]`` keys)."""
        return cls(
            max_concurrent=limits.max_concurrent_streams,
            max_streams=limits.max_streams,
            reset_min_streams=limits.reset_min_streams,
            reset_window_s=limits.reset_window_s,
        )

    # -- streams ---------------------------------------------------------------------------------------

    def begin_read(self) -> None:
        """Before the events of one read: nginx counts new streams per read."""
        self.new_in_read = 0

    def opened(self, stream_id: int, now: float) -> Verdict | None:
        """A request arrived on ``stream_id``. ``None``: serve it; ``LAST_STREAM``: serve it, then GOAWAY;
        a ``REFUSE`` verdict: reset it with REFUSED_STREAM (counted as a premature close); ``CLOSE``."""
        self.new_in_read += 1
        refusal = None
        if self.total >= self.max_streams:
            refusal = REFUSED_AFTER_LAST
        elif self.active >= self.max_concurrent:
            refusal = REFUSED_AT_CAP
        elif self.new_in_read > self.max_per_read:
            refusal = REFUSED_BURST
        if refusal is not None:
            self.closed += 1
            self.premature += 1
            return self._judge() or refusal
        self.total += 1
        self.active += 1
        self._opened_at[stream_id] = now
        return LAST_STREAM if self.total == self.max_streams else None

    def reset_by_peer(self, stream_id: int, now: float) -> Verdict | None:
        """The client reset the stream, or broke a stream rule so that it was reset (MadeYouReset's way).
        It keeps its place until ``done``; a reset soon after opening counts as premature."""
        opened = self._opened_at.get(stream_id)
        if opened is None or opened < 0:
            return None  # not ours, or already counted
        self._opened_at[stream_id] = -1.0  # closed, still active
        self.closed += 1
        if now - opened < self.reset_window_s:
            self.premature += 1
        return self._judge()

    def refused(self, now: float) -> Verdict | None:
        """A stream refused before it was ours (a malformed block the engine or the mapping refused)."""
        self.closed += 1
        self.premature += 1
        return self._judge()

    def reset_by_us(self, stream_id: int) -> None:
        """We reset the stream (upstream failure, a refusal after opening): its exchange is over too."""
        self.done(stream_id)

    def done(self, stream_id: int) -> None:
        """The stream's exchange is over (response complete or aborted, upstream released): its place frees."""
        opened = self._opened_at.pop(stream_id, None)
        if opened is None:
            return
        self.active -= 1
        if opened >= 0:
            self.closed += 1  # a normal close (a reset was counted when it came)

    @property
    def at_cap(self) -> bool:
        """Stop reading the connection until a place frees (``done``)."""
        return self.active >= self.max_concurrent

    def _judge(self) -> Verdict | None:
        if self.closed >= self.reset_min_streams and 2 * self.premature > self.closed:
            return PREMATURE_RESETS
        return None

    # -- bytes and control frames ----------------------------------------------------------------------

    def after_read(self, received: int, payload: int, control: int) -> Verdict | None:
        """After each read, with the connection's running totals (``ServerConnection.received``, ``.payload``,
        ``.control``): nginx's traffic rule and the control-frame ratio."""
        if received >> 3 > payload + self.traffic_allowance:
            return TRAFFIC_FLOOD
        if control > self.control_base + self.control_per_work * (self.total + payload // _WORK_BYTES):
            return CONTROL_FLOOD
        return None
