"""The header-block watch over hand-built frames (hyperframe, not the proxy's engine)."""

from __future__ import annotations

from sentin8.http.h2_blocks import HeaderBlockWatch
from tests import h2frames


def test_a_whole_block_never_leaves_it_open_and_a_missing_continuation_does():
    f = h2frames.RawFrames()
    w = HeaderBlockWatch()
    assert not w.feed(h2frames.preface() + f.headers(1) + h2frames.data(1, b"x" * 5000) + h2frames.ping())
    block = f.block(h2frames.request_fields())
    assert w.feed(f.headers(3, block=block[:5], end_headers=False))
    assert w.feed(h2frames.continuation(3, block[5:8]))
    assert not w.feed(h2frames.continuation(3, block[8:], end_headers=True))


def test_byte_at_a_time_is_open_from_the_type_byte_to_the_last_payload_byte():
    f = h2frames.RawFrames()
    w = HeaderBlockWatch()
    w.feed(h2frames.preface())
    frame = f.headers(1)
    seen = [w.feed(frame[i : i + 1]) for i in range(len(frame))]
    assert seen[:3] == [False, False, False] and all(seen[3:-1]) and seen[-1] is False
    assert not w.feed(h2frames.data(1, b"", end_stream=True))


def test_any_split_of_a_mixed_stream_of_frames_gives_the_same_answers():
    """Every cut point of the same bytes: the watch's answer after the whole equals the unsplit one, and
    the block reads open exactly while the unterminated HEADERS is the last frame begun."""
    f = h2frames.RawFrames()
    block = f.block(h2frames.request_fields())
    closed = h2frames.preface() + f.headers(1) + h2frames.data(1, b"y" * 300, pad=20) + h2frames.ping()
    opened = closed + f.headers(3, block=block[:3], end_headers=False) + h2frames.continuation(3, block[3:6])
    for stream, want in ((closed, False), (opened, True)):
        for cut in range(1, len(stream)):
            w = HeaderBlockWatch()
            w.feed(stream[:cut])
            assert w.feed(stream[cut:]) is want, cut
        w = HeaderBlockWatch()
        assert all(w.feed(stream[i : i + 1]) is not None for i in range(len(stream)))
        assert w.open is want
