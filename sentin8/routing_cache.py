"""The routing table's cache file format: the last complete, fresh table, for a cold start during an outage.
Sans-IO (bytes in, bytes out); ``supervisor/routing_cache.py`` writes and reads the file.

Layout (big-endian)::

    8 bytes   magic  b"S8ROUTE\\n"   (anything else: not ours)
    2 bytes   format version (FORMAT_VERSION; another: written by another release, ignored)
    8 bytes   written at, wall clock in µs
    8 bytes   payload length
    32 bytes  SHA-256 of the payload
    payload   the routing table as the resolver publishes it (``sentin8.routing.encode``)

A file that is short, long, foreign, of another version, fails its checksum or does not decode is refused with
``CacheInvalid`` saying why: a cold start then proceeds as if there were no cache (boot retries, then what is
known). The checksum, not the rename, is what makes a torn file harmless: a rename is atomic only where the
file system keeps its promises.
"""

from __future__ import annotations

import hashlib
import struct

import msgspec

from . import routing
from .routing import RoutingTable

FILE_NAME = "routing-cache.bin"
MAGIC = b"S8ROUTE\n"
FORMAT_VERSION = 1  # bump when RoutingTable changes in a way an older file must not be decoded with
_HEADER = struct.Struct(">8sHQQ32s")
HEADER_BYTES = _HEADER.size


class CacheInvalid(ValueError):
    """The file is not a usable cache; ``str()`` is the reason, for the log line."""


def encode(payload: bytes, written_at: float) -> bytes:
    """The whole file for ``payload`` (an encoded routing table)."""
    digest = hashlib.sha256(payload).digest()
    return _HEADER.pack(MAGIC, FORMAT_VERSION, int(written_at * 1e6), len(payload), digest) + payload


def decode(blob: bytes) -> tuple[RoutingTable, float]:
    """(table, written_at) from a whole file, or ``CacheInvalid``."""
    if len(blob) < HEADER_BYTES:
        raise CacheInvalid(f"{len(blob)} bytes: shorter than the {HEADER_BYTES}-byte header (torn?)")
    magic, version, written_us, length, digest = _HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise CacheInvalid("not a routing cache file (bad magic)")
    if version != FORMAT_VERSION:
        raise CacheInvalid(f"format version {version}, this release reads {FORMAT_VERSION}")
    payload = blob[HEADER_BYTES:]
    if len(payload) != length:
        raise CacheInvalid(f"payload is {len(payload)} bytes, the header says {length} (torn?)")
    if hashlib.sha256(payload).digest() != digest:
        raise CacheInvalid("checksum mismatch (torn or altered)")
    try:
        table = routing.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CacheInvalid(f"payload does not decode as a routing table ({exc})") from None
    return table, written_us / 1e6
