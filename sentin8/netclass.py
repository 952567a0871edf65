"""Internal/external classification of a peer address (sans-IO)."""

from __future__ import annotations

import ipaddress


class Classifier:
    """``is_internal(ip)`` against the configured CIDRs; IPv4-mapped IPv6 peers are judged as IPv4."""

    def __init__(self, cidrs: list[str]) -> None:
        nets = [ipaddress.ip_network(c, strict=False) for c in cidrs]
        self._v4 = [(int(n.network_address), int(n.netmask)) for n in nets if n.version == 4]
        self._v6 = [(int(n.network_address), int(n.netmask)) for n in nets if n.version == 6]
        self._cache: dict[str, bool] = {}

    def is_internal(self, host: str) -> bool:
        hit = self._cache.get(host)
        if hit is not None:
            return hit
        addr = ipaddress.ip_address(host.split("%", 1)[0])
        if addr.version == 6 and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        value = int(addr)
        nets = self._v4 if addr.version == 4 else self._v6
        internal = any(value & mask == net for net, mask in nets)
        if len(self._cache) >= 65536:  # bounded under a rotating-address flood
            self._cache.clear()
        self._cache[host] = internal
        return internal

    def contains(self, host: str) -> bool:
        """The same test, for a list that is not the internal one (``listen.proxy_protocol_from``)."""
        return self.is_internal(host)
