"""The runtime policy overlay: the edge-policy values an operator changed through the management API.

Sans-IO. The effective policy is the config file's ``[policy]`` with the overlay's set fields on top; an empty
overlay is the config file. Only the five runtime keys can be overlaid (the header caps stay config-only).
The overlay travels through shared memory as JSON (``sentin8.shm.policy``) and is persisted as JSON in
``tls.state_dir`` so it survives a fleet restart.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import msgspec
import msgspec.inspect

from .atomic_file import write_atomic
from .config import Policy

FILE_NAME = "runtime-policy.json"


def _literal_values(struct: type, name: str) -> tuple[str, ...]:
    """The values a config Literal field accepts: the overlay follows the config file's own type."""
    field = next(f for f in msgspec.inspect.type_info(struct).fields if f.name == name)
    kind = field.type.type if isinstance(field.type, msgspec.inspect.Metadata) else field.type  # doc(...) wraps it
    return tuple(kind.values)


RATE_KEYS = _literal_values(Policy, "rate_limit_key")
RPS_MAX = 1_000_000.0


class OverlayError(ValueError):
    """Invalid input, phrased for a 422: ``field`` names the offending key."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class Overlay(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """Each field None = take the config file's value."""

    waf: bool | None = None
    rate_limit: bool | None = None
    rate_limit_rps: float | None = None
    rate_limit_burst: float | None = None
    rate_limit_key: str | None = None


RUNTIME_KEYS = tuple(Overlay.__struct_fields__)


def _positive(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise OverlayError(field, "must be a number")
    v = float(value)
    if not math.isfinite(v) or not 0 < v <= RPS_MAX:
        raise OverlayError(field, f"must be > 0 and <= {RPS_MAX:g}")
    return v


def validate_changes(body: Any) -> dict[str, Any]:
    """A PUT body -> the checked changes; ``null`` for a key means back to the config file's value."""
    if not isinstance(body, dict):
        raise OverlayError("body", "must be a JSON object")
    if not body:
        raise OverlayError("body", f"set at least one of {', '.join(RUNTIME_KEYS)}")
    out: dict[str, Any] = {}
    for field, value in body.items():
        if field not in RUNTIME_KEYS:
            raise OverlayError(str(field)[:64], f"unknown key (runtime keys: {', '.join(RUNTIME_KEYS)})")
        if value is None:
            out[field] = None
        elif field in ("waf", "rate_limit"):
            if not isinstance(value, bool):
                raise OverlayError(field, "must be true or false")
            out[field] = value
        elif field == "rate_limit_key":
            if value not in RATE_KEYS:
                raise OverlayError(field, "must be one of " + ", ".join(f'"{k}"' for k in RATE_KEYS))
            out[field] = value
        else:
            out[field] = _positive(field, value)
    return out


def apply(overlay: Overlay, changes: dict[str, Any]) -> Overlay:
    return msgspec.structs.replace(overlay, **changes)


def effective(base: Policy, overlay: Overlay) -> Policy:
    """The config's policy with every set overlay field on top."""
    changes = {k: v for k, v in msgspec.structs.asdict(overlay).items() if v is not None}
    return msgspec.structs.replace(base, **changes) if changes else base


def encode(overlay: Overlay) -> bytes:
    return msgspec.json.encode(overlay)


def decode(data: bytes) -> Overlay:
    """Strict: what was written by ``encode``, re-checked as if it came from an operator."""
    raw = json.loads(data) if data else {}
    if not isinstance(raw, dict):
        raise OverlayError("body", "must be a JSON object")
    return apply(Overlay(), validate_changes(raw)) if raw else Overlay()


def load(state_dir: str) -> Overlay:
    """The persisted overlay, or an empty one when there is none. An unreadable file raises OverlayError."""
    path = os.path.join(state_dir, FILE_NAME)
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return Overlay()
    except OSError as exc:
        raise OverlayError(path, f"cannot read ({exc.strerror})") from None
    try:
        return decode(data)
    except (ValueError, OverlayError) as exc:
        raise OverlayError(path, f"not a valid overlay ({exc})") from None


def save(state_dir: str, overlay: Overlay) -> None:
    """Atomically replace the persisted overlay (write a temp file, fsync, rename)."""
    os.makedirs(state_dir, exist_ok=True)
    write_atomic(os.path.join(state_dir, FILE_NAME), encode(overlay))
