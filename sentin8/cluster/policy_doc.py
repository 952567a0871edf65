"""Runtime policy across hosts (sans-IO): the Valkey document, the script that publishes it, and the rule that
decides which of a host's overlay and the cluster's wins.

The document is one hash ``sentin8:{<cluster_id>}:policy`` = ``{v, overlay, node, lineage}``: ``v`` a version
Valkey increments on every publication (one script: the increment, the write and the notification on
``sentin8:{<cluster_id>}:policy:changed`` are atomic), ``node`` the host that published it, ``lineage`` a random
id set when the document is created. Last writer wins by version: every host adopts the highest version it
sees. A Valkey that lost its data (restarted without persistence) starts a new lineage at version 1; a host that
knows another lineage adopts the new one whatever its version, instead of ignoring it until it passes the old
count.
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple

from ..atomic_file import write_atomic

VERSION_FILE = "runtime-policy-version.json"

PUBLISH = """
redis.call('HSETNX', KEYS[1], 'lineage', ARGV[3])
local v = redis.call('HINCRBY', KEYS[1], 'v', 1)
redis.call('HSET', KEYS[1], 'overlay', ARGV[1], 'node', ARGV[2])
local lineage = redis.call('HGET', KEYS[1], 'lineage')
redis.call('PUBLISH', KEYS[2], v)
return {v, lineage}
"""


def doc_key(cluster_id: str) -> str:
    return f"sentin8:{{{cluster_id}}}:policy"


def channel(cluster_id: str) -> str:
    return f"sentin8:{{{cluster_id}}}:policy:changed"


class Version(NamedTuple):
    """Which cluster publication a host's overlay is (0, "" = never shared)."""

    version: int = 0
    lineage: str = ""
    node: str = ""


class Remote(NamedTuple):
    version: Version
    overlay: bytes


def parse(fields: dict[bytes, bytes]) -> Remote | None:
    """The document as HGETALL returns it; None when absent or incomplete."""
    try:
        v = int(fields[b"v"])
        return Remote(Version(v, fields[b"lineage"].decode(), fields.get(b"node", b"").decode()), fields[b"overlay"])
    except (KeyError, ValueError, UnicodeDecodeError):
        return None


def adopt(local: Version, remote: Remote | None) -> bool:
    """Whether a host whose overlay is ``local`` takes the cluster's document."""
    if remote is None:
        return False
    return remote.version.lineage != local.lineage or remote.version.version > local.version


def should_seed(local: Version, remote: Remote | None, overlay_set: bool) -> bool:
    """Valkey holds no document but this host knows a policy (a shared one, or its own overlay): publish it."""
    return remote is None and (local.version > 0 or overlay_set)


def load_version(state_dir: str) -> Version:
    try:
        with open(os.path.join(state_dir, VERSION_FILE), "rb") as fh:
            raw = json.loads(fh.read())
        return Version(int(raw["version"]), str(raw["lineage"]), str(raw.get("node", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return Version()


def save_version(state_dir: str, version: Version) -> None:
    """Beside the overlay file (written after it: a crash between the two re-adopts the same overlay)."""
    os.makedirs(state_dir, exist_ok=True)
    write_atomic(os.path.join(state_dir, VERSION_FILE), json.dumps(version._asdict()).encode())
