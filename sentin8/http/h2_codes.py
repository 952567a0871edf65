"""HTTP/2 wire constants (RFC 9113 §7, §5.1.1), engine-free, shared by the adapter, the budgets and the shell.

Plain ints, not an enum: they travel in RST_STREAM and GOAWAY frames and are compared on the data path.
"""

from __future__ import annotations

NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
SETTINGS_TIMEOUT = 0x4
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
CONNECT_ERROR = 0xA
ENHANCE_YOUR_CALM = 0xB
INADEQUATE_SECURITY = 0xC
HTTP_1_1_REQUIRED = 0xD

ERROR_NAMES: dict[int, str] = {
    NO_ERROR: "no_error",
    PROTOCOL_ERROR: "protocol_error",
    INTERNAL_ERROR: "internal_error",
    FLOW_CONTROL_ERROR: "flow_control_error",
    SETTINGS_TIMEOUT: "settings_timeout",
    STREAM_CLOSED: "stream_closed",
    FRAME_SIZE_ERROR: "frame_size_error",
    REFUSED_STREAM: "refused_stream",
    CANCEL: "cancel",
    COMPRESSION_ERROR: "compression_error",
    CONNECT_ERROR: "connect_error",
    ENHANCE_YOUR_CALM: "enhance_your_calm",
    INADEQUATE_SECURITY: "inadequate_security",
    HTTP_1_1_REQUIRED: "http_1_1_required",
}


def error_name(code: int) -> str:
    """``enhance_your_calm`` for 0xb; an unknown code (RFC 9113 §7: not an error by itself) as ``code_0x2a``."""
    return ERROR_NAMES.get(code) or f"code_{code:#x}"


MAX_STREAM_ID = (1 << 31) - 1  # the first GOAWAY of a graceful drain names it (RFC 9113 §6.8)


def goaway_frame(last_stream_id: int, error_code: int) -> bytes:
    """A GOAWAY frame (RFC 9113 §6.8), built by hand for when the engine has no session left to write one."""
    return (
        b"\x00\x00\x08\x07\x00\x00\x00\x00\x00"
        + (last_stream_id & MAX_STREAM_ID).to_bytes(4, "big")
        + error_code.to_bytes(4, "big")
    )
