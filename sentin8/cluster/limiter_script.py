"""The limiter's Valkey side: key names and the two scripts, as text (sans-IO; ``supervisor/cluster_sync.py``
runs them).

``SYNC`` is ``bucket_merge.merge`` over a batch of keys, on Valkey's clock (``TIME``), so hosts' clocks never
enter the arithmetic: a host sends counts, never times. Each key is a hash ``{l: level µ-units, t: µs}`` that
expires once it would be full again (``bucket_merge.expiry_ms``), so Valkey holds only keys that are short of
tokens somewhere. Key names carry the 64-bit hash of the bucket key (client address, address|host, |host), never
the address itself, and one hash tag per cluster id so that a batch is one script call in Valkey Cluster too.

``HEARTBEAT`` records this host in a sorted set scored by Valkey's clock and drops hosts not seen for
``HOST_TTL_MS``: its answer is H, the hosts seen, from which each host computes the debt floor D.
"""

from __future__ import annotations

HOST_TTL_MS = 3000  # a host that has not synced for this long no longer counts in H
HEARTBEAT_S = 0.5

SYNC = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local rate = tonumber(ARGV[1])
local full = tonumber(ARGV[2])
local floor = -tonumber(ARGV[3])
local sent = {}
for n in string.gmatch(ARGV[4], '[^,]+') do sent[#sent + 1] = tonumber(n) end
local out = {}
for i, key in ipairs(KEYS) do
  local v = redis.call('HMGET', key, 'l', 't')
  local level = full
  if v[1] then
    level = tonumber(v[1])
    local dt = now - tonumber(v[2])
    if dt > 0 then level = math.min(full, level + math.floor(dt * rate)) end
  end
  level = math.max(floor, level - sent[i])
  local text = string.format('%d', level)
  redis.call('HSET', key, 'l', text, 't', string.format('%d', now))
  redis.call('PEXPIRE', key, math.ceil(math.max(0, full - level) / rate / 1000) + 1000)
  out[i] = text
end
return table.concat(out, ',')
"""

HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], 10 * tonumber(ARGV[2]))
return redis.call('ZCARD', KEYS[1])
"""


def prefix(cluster_id: str) -> str:
    return f"sentin8:{{{cluster_id}}}"


def bucket_key(cluster_id: str, key_hash: int) -> str:
    return f"{prefix(cluster_id)}:rl:{key_hash:016x}"


def hosts_key(cluster_id: str) -> str:
    return f"{prefix(cluster_id)}:hosts"


def sync_args(rate: float, full_u: int, floor_u: int, sent_u: list[int]) -> list[str]:
    """ARGV for ``SYNC``: the rate (µ-units per µs = tokens per second), the burst and the debt floor in
    µ-units, then the admitted amounts (µ-units), one per key, as one comma-separated argument (one string to
    encode and one to parse instead of one per key: the syncer's CPU per key is what bounds a flood)."""
    return [repr(float(rate)), str(full_u), str(floor_u), ",".join(map(str, sent_u))]


def sync_levels(reply: bytes | str) -> list[int]:
    """``SYNC``'s answer: the new global levels (µ-units), in the order of the keys."""
    text = reply.decode() if isinstance(reply, bytes) else reply
    return [int(x) for x in text.split(",")] if text else []
