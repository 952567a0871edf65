"""The Valkey registry (Captain): ``captain:svc:<service>`` hashes -> ``list[Instance]``.

Each hash field is an instance id, each value a JSON object
``{"host": "10.1.2.3", "port": 8443, "state": "Active", "health_ts": 1764460000.25, "tls": true}``, optionally
with ``"proxy_protocol": "v2"`` (an L4 pipe to the instance starts with a PROXY v2 header; absent, null or ""
= none, so records written before the field existed mean what they always meant).
Parsing is sans-IO (``parse_registry``); ``load_registry`` only fetches (SCAN + pipelined HGETALL).
A malformed entry is skipped and counted, never fatal: one bad write by one service must not take the
routing of every other service down with it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from ..routing import Instance

KEY_PREFIX = "captain:svc:"
CHANGED_CHANNEL = "captain:changed"
PROXY_PROTOCOLS = ("", "v2")  # an instance's proxy_protocol: none, or a PROXY v2 header on its L4 pipes

_MAX_ERRORS_KEPT = 20  # enough to diagnose; a flood of bad entries must not grow status() without bound


class MalformedEntry(ValueError):
    pass


@dataclass
class RegistryLoad:
    instances: list[Instance] = field(default_factory=list)
    malformed: int = 0
    errors: list[str] = field(default_factory=list)  # the first few, as "key field: reason"

    def reject(self, where: str, reason: str) -> None:
        self.malformed += 1
        if len(self.errors) < _MAX_ERRORS_KEPT:
            self.errors.append(f"{where}: {reason}")


def _text(value: str | bytes, what: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedEntry(f"{what} is not UTF-8") from None
    return value


def parse_entry(service: str, instance_id: str, raw: str | bytes) -> Instance:
    """One hash field -> an Instance, or ``MalformedEntry`` saying why not."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedEntry(f"not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise MalformedEntry("not a JSON object")
    host = doc.get("host")
    if not isinstance(host, str) or not host or len(host) > 253 or any(c.isspace() for c in host):
        raise MalformedEntry(f"host {host!r} is not a host")
    port = doc.get("port")
    # bool is an int subclass: `true` is not a port
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise MalformedEntry(f"port {port!r} is not a port")
    state = doc.get("state")
    if not isinstance(state, str):
        raise MalformedEntry(f"state {state!r} is not a string")
    health_ts = doc.get("health_ts")
    # Required: a registry instance without a heartbeat would count as forever fresh (None = file instance).
    if not isinstance(health_ts, int | float) or isinstance(health_ts, bool) or not math.isfinite(health_ts):
        raise MalformedEntry(f"health_ts {health_ts!r} is not a timestamp")
    tls = doc.get("tls", False)
    if not isinstance(tls, bool):
        raise MalformedEntry(f"tls {tls!r} is not a boolean")
    proxy_protocol = doc.get("proxy_protocol")
    if proxy_protocol is None:
        proxy_protocol = ""
    elif not isinstance(proxy_protocol, str) or proxy_protocol not in PROXY_PROTOCOLS:
        raise MalformedEntry(f'proxy_protocol {proxy_protocol!r} is not "v2" (or absent)')
    return Instance(instance_id, service, host, port, state, float(health_ts), tls, proxy_protocol)


def parse_registry(hashes: Mapping[str | bytes, Mapping[str | bytes, str | bytes]]) -> RegistryLoad:
    """``{"captain:svc:web": {"web-1": "{...}"}}`` -> instances sorted by (service, id), plus what was skipped."""
    out = RegistryLoad()
    for raw_key, fields in hashes.items():
        try:
            key = _text(raw_key, "key")
        except MalformedEntry as exc:
            out.reject(repr(raw_key), str(exc))
            continue
        service = key.removeprefix(KEY_PREFIX)
        if not key.startswith(KEY_PREFIX) or not service:
            out.reject(key, "not a captain:svc:<service> key")
            continue
        for raw_id, raw_value in fields.items():
            where = f"{key} {raw_id!r}"
            try:
                instance_id = _text(raw_id, "instance id")
                if not instance_id:
                    raise MalformedEntry("empty instance id")
                where = f"{key} {instance_id}"
                out.instances.append(parse_entry(service, instance_id, raw_value))
            except MalformedEntry as exc:
                out.reject(where, str(exc))
    out.instances.sort(key=lambda i: (i.service, i.id))
    return out


async def fetch_registry(client: aioredis.Redis, scan_count: int = 1000, batch: int = 500) -> RegistryLoad:
    """SCAN ``captain:svc:*`` then HGETALL every key in pipelined batches (one round trip per batch).

    A key that is not a hash (WRONGTYPE) is counted as malformed; connection errors propagate.
    """
    keys = sorted({k async for k in client.scan_iter(match=KEY_PREFIX + "*", count=scan_count)})
    hashes: dict[str | bytes, Mapping[str | bytes, str | bytes]] = {}
    wrong: list[str | bytes] = []
    for start in range(0, len(keys), batch):
        chunk = keys[start : start + batch]
        pipe = client.pipeline(transaction=False)
        for key in chunk:
            pipe.hgetall(key)
        results = await pipe.execute(raise_on_error=False)
        for key, result in zip(chunk, results, strict=True):
            if isinstance(result, aioredis.ResponseError):
                wrong.append(key)
            elif isinstance(result, Exception):
                raise result  # a connection problem mid-batch: the whole load fails, the last good one stays
            else:
                hashes[key] = result
    out = parse_registry(hashes)
    for key in wrong:
        out.reject(key.decode("utf-8", "replace") if isinstance(key, bytes) else key, "not a hash")
    return out
