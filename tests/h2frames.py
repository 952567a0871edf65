"""Hand-built HTTP/2 frames for the attack tests (hyperframe + hpack, not the proxy's engine).

A test client must not share the code it tests: frames here are serialized by python-hyper's hyperframe and
header blocks encoded by its hpack, so a frame the proxy's engine (nghttp2) would never produce can be sent.
``RawFrames`` keeps one HPACK encoder per connection (its dynamic table must match the server's decoder).
"""

from __future__ import annotations

from collections import Counter

import hpack
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

Fields = list[tuple[bytes, bytes]]


def request_fields(path: bytes = b"/", authority: bytes = b"www.example.com", method: bytes = b"GET") -> Fields:
    return [(b":method", method), (b":authority", authority), (b":scheme", b"https"), (b":path", path)]


class RawFrames:
    """Frame builders with this connection's HPACK encoder."""

    def __init__(self) -> None:
        self.encoder = hpack.Encoder()

    def block(self, fields: Fields) -> bytes:
        return self.encoder.encode(fields)

    def headers(
        self,
        stream_id: int,
        fields: Fields | None = None,
        *,
        end_stream: bool = True,
        end_headers: bool = True,
        block: bytes | None = None,
    ) -> bytes:
        f = HeadersFrame(stream_id)
        f.data = self.block(fields if fields is not None else request_fields()) if block is None else block
        if end_headers:
            f.flags.add("END_HEADERS")
        if end_stream:
            f.flags.add("END_STREAM")
        return f.serialize()


def preface(settings: dict[int, int] | None = None, ack: bool = True) -> bytes:
    """The client preface, its SETTINGS, and (``ack``) the ACK of the server's SETTINGS."""
    out = PREFACE + settings_frame(settings or {})
    return out + settings_frame(ack=True) if ack else out


def settings_frame(settings: dict[int, int] | None = None, *, ack: bool = False) -> bytes:
    f = SettingsFrame(0, flags=["ACK"] if ack else [])
    if settings:
        f.settings = dict(settings)
    return f.serialize()


def continuation(stream_id: int, block: bytes, *, end_headers: bool = False) -> bytes:
    f = ContinuationFrame(stream_id)
    f.data = block
    if end_headers:
        f.flags.add("END_HEADERS")
    return f.serialize()


def data(stream_id: int, payload: bytes = b"", *, end_stream: bool = False, pad: int = 0) -> bytes:
    f = DataFrame(stream_id)
    f.data = payload
    if pad:
        f.flags.add("PADDED")
        f.pad_length = pad
    if end_stream:
        f.flags.add("END_STREAM")
    return f.serialize()


def rst(stream_id: int, code: int = 0x8) -> bytes:
    f = RstStreamFrame(stream_id)
    f.error_code = code
    return f.serialize()


def ping(opaque: int = 0, *, ack: bool = False) -> bytes:
    f = PingFrame(0, flags=["ACK"] if ack else [])
    f.opaque_data = opaque.to_bytes(8, "big")
    return f.serialize()


def window_update(stream_id: int, increment: int) -> bytes:
    """Any increment, 0 included (hyperframe refuses to serialize 0: the frame is built by hand then)."""
    if increment == 0:
        return b"\x00\x00\x04\x08\x00" + stream_id.to_bytes(4, "big") + b"\x00\x00\x00\x00"
    f = WindowUpdateFrame(stream_id)
    f.window_increment = increment
    return f.serialize()


def priority(stream_id: int, depends_on: int = 0, weight: int = 16) -> bytes:
    f = PriorityFrame(stream_id)
    f.depends_on = depends_on
    f.stream_weight = weight
    return f.serialize()


def goaway(last_stream_id: int = 0, code: int = 0) -> bytes:
    f = GoAwayFrame(0)
    f.last_stream_id = last_stream_id
    f.error_code = code
    return f.serialize()


def unknown(frame_type: int = 0xFA, payload: bytes = b"x" * 8, stream_id: int = 0) -> bytes:
    """An extension frame type; receivers MUST ignore it (RFC 9113 §5.5)."""
    return len(payload).to_bytes(3, "big") + bytes([frame_type, 0]) + stream_id.to_bytes(4, "big") + payload


def parse(buf: bytes | bytearray) -> tuple[list[Frame], bytes]:
    """The complete frames in ``buf`` and the bytes left over (a partial frame)."""
    frames = []
    view = memoryview(bytes(buf))
    while len(view) >= 9:
        frame, length = Frame.parse_frame_header(view[:9])
        if len(view) < 9 + length:
            break
        frame.parse_body(view[9 : 9 + length])
        frames.append(frame)
        view = view[9 + length :]
    return frames, bytes(view)


def kinds(frames: list[Frame]) -> Counter[str]:
    """``{"RstStream(7)": 2, "Headers": 1, ...}``: frame types, with the error code where there is one."""
    out: Counter[str] = Counter()
    for f in frames:
        name = type(f).__name__.removesuffix("Frame")
        if isinstance(f, RstStreamFrame | GoAwayFrame):
            name += f"({f.error_code})"
        out[name] += 1
    return out
