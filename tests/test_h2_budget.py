"""The HTTP/2 attack budgets, sans-IO: the counts alone (tests/test_h2_attacks.py drives them with frames)."""

from __future__ import annotations

from sentin8.http import h2_codes
from sentin8.http.h2_budget import (
    CLOSE,
    CONTROL_FLOOD,
    GOAWAY,
    LAST_STREAM,
    PREMATURE_RESETS,
    REASONS,
    REFUSE,
    REFUSED_AFTER_LAST,
    REFUSED_AT_CAP,
    REFUSED_BURST,
    TRAFFIC_FLOOD,
    StreamBudget,
)


def open_n(b: StreamBudget, n: int, first: int = 1, now: float = 0.0) -> list[int]:
    sids = list(range(first, first + 2 * n, 2))
    for sid in sids:
        assert b.opened(sid, now) is None
    return sids


def test_verdicts_say_what_to_do():
    assert {v.action for v in (REFUSED_AT_CAP, REFUSED_BURST, REFUSED_AFTER_LAST)} == {REFUSE}
    assert (LAST_STREAM.action, LAST_STREAM.code) == (GOAWAY, h2_codes.NO_ERROR)
    for v in (PREMATURE_RESETS, TRAFFIC_FLOOD, CONTROL_FLOOD):
        assert (v.action, v.code) == (CLOSE, h2_codes.ENHANCE_YOUR_CALM)
    assert REFUSED_AT_CAP.code == h2_codes.REFUSED_STREAM
    assert len(set(REASONS)) == len(REASONS) == 7 and all(r.startswith("h2_") for r in REASONS)


def test_a_stream_holds_its_place_until_its_exchange_is_done_not_until_its_reset():
    b = StreamBudget(max_concurrent=3)
    s1, _, _ = open_n(b, 3)
    assert b.at_cap
    assert b.reset_by_peer(s1, 5.0) is None  # reset late: not premature, and still holding its place
    assert b.at_cap and b.opened(7, 5.0) is REFUSED_AT_CAP
    b.done(s1)
    assert not b.at_cap and b.opened(9, 5.0) is None
    b.done(s1)  # twice: no effect
    assert b.active == 3


def test_reset_by_us_frees_the_place():
    b = StreamBudget(max_concurrent=1)
    (s,) = open_n(b, 1)
    b.reset_by_us(s)
    assert b.active == 0 and b.closed == 1 and b.premature == 0


def test_rapid_reset_is_answered_at_the_premature_reset_budget():
    """CVE-2023-44487: HEADERS + RST_STREAM pairs. Each stream keeps its place until its exchange is done,
    so the client cannot have more than the cap running; and >50% of >=100 closes being premature ends it."""
    b = StreamBudget()
    verdict = None
    for i in range(1000):
        sid = 1 + 2 * i
        b.begin_read()
        v = b.opened(sid, 0.0)
        if v is not None:
            verdict = v
            break
        verdict = b.reset_by_peer(sid, 0.001)
        if verdict is not None:
            break
        b.done(sid)  # the shell aborted the exchange at once
    assert verdict is PREMATURE_RESETS and i == 99  # at the 100th reset stream


def test_made_you_reset_counts_like_a_client_reset():
    """CVE-2025-8671: frames that make the *server* reset (the engine's StreamReset, remote=False) go through
    reset_by_peer too; the place stays held until the exchange is done."""
    b = StreamBudget(max_concurrent=100)
    sids = open_n(b, 100)
    for sid in sids[:99]:
        assert b.reset_by_peer(sid, 0.1) is None
    assert b.at_cap  # none done yet: nothing new may start
    assert b.reset_by_peer(sids[99], 0.1) is PREMATURE_RESETS


def test_healthy_traffic_with_some_cancellations_is_not_premature():
    b = StreamBudget()
    t = 0.0
    for i in range(900):
        sid = 1 + 2 * i
        b.begin_read()
        assert b.opened(sid, t) is None
        if i % 3 == 0:  # a third cancelled quickly (a browser navigating away)
            assert b.reset_by_peer(sid, t + 0.01) is None
        b.done(sid)
        t += 0.01
    assert b.premature == 300 and b.closed == 900


def test_resets_after_the_window_are_not_premature():
    b = StreamBudget(reset_min_streams=10)
    for i in range(50):
        sid = 1 + 2 * i
        b.opened(sid, 0.0)
        assert b.reset_by_peer(sid, 1.5) is None
        b.done(sid)
    assert b.premature == 0 and b.closed == 50


def test_refused_streams_count_as_premature_closes():
    b = StreamBudget()
    for _ in range(99):
        assert b.refused(0.0) is None
    assert b.refused(0.0) is PREMATURE_RESETS


def test_nginx_new_streams_per_read():
    """More than 2x the cap new streams in one read are refused (local answers can finish within the read)."""
    b = StreamBudget(max_concurrent=10, reset_min_streams=10_000)
    b.begin_read()
    for i in range(20):
        assert b.opened(1 + 2 * i, 0.0) is None
        b.done(1 + 2 * i)
    assert b.opened(41, 0.0) is REFUSED_BURST
    b.begin_read()
    assert b.opened(43, 0.0) is None


def test_the_thousandth_stream_is_the_last():
    b = StreamBudget(max_streams=1000, reset_min_streams=10_000)
    for i in range(999):
        b.begin_read()
        assert b.opened(1 + 2 * i, 0.0) is None
        b.done(1 + 2 * i)
    assert b.opened(1999, 0.0) is LAST_STREAM
    assert b.opened(2001, 0.0) is REFUSED_AFTER_LAST


def test_refusals_can_end_the_connection():
    b = StreamBudget(max_concurrent=1)
    open_n(b, 1)
    verdicts = [b.opened(3 + 2 * i, 0.0) for i in range(100)]
    assert verdicts[:99] == [REFUSED_AT_CAP] * 99 and verdicts[99] is PREMATURE_RESETS


def test_traffic_rule():
    """nginx: close when the bytes read / 8 exceed the payload + 1 MiB."""
    b = StreamBudget()
    assert b.after_read(8 << 20, 0, 0) is None
    assert b.after_read((8 << 20) + 8, 0, 0) is TRAFFIC_FLOOD
    assert b.after_read(100 << 20, 100 << 20, 0) is None  # bulk DATA is payload


def test_control_frame_ratio():
    b = StreamBudget()
    assert b.after_read(0, 0, 1000) is None
    assert b.after_read(0, 0, 1001) is CONTROL_FLOOD
    assert b.after_read(0, 10 * 16384, 1100) is None  # 10 DATA frames of work allow 100 more
    open_n(b, 5)
    assert b.after_read(0, 10 * 16384, 1150) is None
    assert b.after_read(0, 10 * 16384, 1151) is CONTROL_FLOOD


def test_the_http2_keys_reach_the_budget_and_the_defaults_are_the_configs():
    """One place owns each number: the [http2] defaults; H2Limits and StreamBudget read them."""
    from sentin8.config import Http2, load_bytes
    from sentin8.http.h2_limits import H2Limits

    d, b = Http2(), StreamBudget()
    assert (b.max_concurrent, b.max_streams) == (d.max_concurrent_streams, d.max_streams_per_connection)
    assert (b.reset_min_streams, b.reset_window_s) == (d.premature_reset_min_streams, d.premature_reset_window_s)
    cfg = load_bytes(
        b"[http2]\nmax_concurrent_streams = 5\nmax_streams_per_connection = 7\n"
        b"premature_reset_min_streams = 20\npremature_reset_window_s = 2.5\n"
    )
    b = StreamBudget.of(H2Limits.from_config(cfg))
    assert (b.max_concurrent, b.max_per_read, b.max_streams) == (5, 10, 7)
    assert (b.reset_min_streams, b.reset_window_s) == (20, 2.5)
    for sid in range(1, 11, 2):
        assert b.opened(sid, 0.0) is None
    assert b.at_cap and b.opened(11, 0.0).counter == "h2_refused_at_cap"
