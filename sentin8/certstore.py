"""The certificate store: which ML-DSA-65 certificate answers a TLS server name.

Layout (certbot style, ARCHITECTURE.md §5)::

    <cert_dir>/<hostname>/fullchain.pem + privkey.pem       exact name
    <cert_dir>/_wildcard.<domain>/fullchain.pem + ...        *.<domain> (one label, as in X.509)

``lookup`` runs on the handshake path, so it is built to be cheap: each name's answer (a certificate or
"none here") is cached and re-validated by ``stat`` at most once per ``revalidate_s``; a changed file
(mtime, size, inode: certbot swaps symlinks) is re-read, so renewals and new names are picked up without a
restart and without watcher threads. An unusable file (not ML-DSA-65, expired, key mismatch, unparsable) is
logged once per file version and skipped. A pair is parsed and validated by ``certpair``; when no store
certificate answers, ``select`` serves the bootstrap certificate (``bootstrap_cert``, its own life cycle under
``<state_dir>/bootstrap/``).

One ``CertStore`` per process, used from one thread (the worker's event loop): it holds no locks of its own.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .bootstrap_cert import BootstrapCert
from .certpair import FULLCHAIN, PRIVKEY, ServerCert, StatSig, UnusableCertificate, parse_pair, read_file
from .eventlog import event

log = logging.getLogger(__name__)

WILDCARD_PREFIX = "_wildcard."

# LDH host names only: the SNI is attacker-controlled and becomes a path, so "/", "..", "_" and
# anything non-ASCII are refused before touching the file system.
_HOSTNAME_RE = re.compile(
    r"(?=.{1,253}\Z)(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z"
)

@dataclass(frozen=True, slots=True)
class CertExpiry:
    """One certificate the store can serve: ``sentin8_certificate_expiry_seconds{hostname, source}``."""

    hostname: str  # "shop.example.com", "*.example.com", or "bootstrap"
    source: str  # "store" | "bootstrap"
    not_after: float  # unix seconds

    def seconds_left(self, now: float) -> float:
        return self.not_after - now


def expiry_metric_lines(certs: Sequence[CertExpiry], now: float) -> list[str]:
    """Prometheus text exposition of ``sentin8_certificate_expiry_seconds`` (seconds until not-after; negative
    once expired) for ``CertStore.expiry()``. Pure: the metrics endpoint adds it to its page."""
    name = "sentin8_certificate_expiry_seconds"
    lines = [
        f"# HELP {name} Seconds until the certificate's notAfter, per served certificate.",
        f"# TYPE {name} gauge",
    ]
    for c in certs:
        host = c.hostname.replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'{name}{{hostname="{host}",source="{c.source}"}} {c.seconds_left(now):.0f}')
    return lines


@dataclass(slots=True)
class _Entry:
    cert: ServerCert | None
    sig: tuple[StatSig, StatSig] | None  # None: the pair is (partly) missing
    checked: float  # monotonic time of the last stat


def normalize_hostname(name: str | bytes | None) -> str | None:
    """Lower-cased LDH host name without a trailing dot, or None if it cannot name a store directory.

    Asked for every handshake's SNI: answers are remembered per raw name (the regex, the decode and the case
    folding were ~7k instructions a handshake). At most ``_NAMES_KEPT`` names: a flood of distinct names
    empties the memo, it never grows past that."""
    if name is None:
        return None
    known = _names.get(name, _UNKNOWN)
    if known is not _UNKNOWN:
        return known  # type: ignore[return-value]
    normal = _normalize(name)
    if len(_names) >= _NAMES_KEPT:
        _names.clear()
    _names[name] = normal
    return normal


def _normalize(name: str | bytes) -> str | None:
    if isinstance(name, bytes):
        try:
            name = name.decode("ascii")
        except UnicodeDecodeError:
            return None
    name = name.lower().removesuffix(".")
    return name if _HOSTNAME_RE.match(name) else None


_NAMES_KEPT = 4096
_names: dict[str | bytes, str | None] = {}
_UNKNOWN = object()


def store_dirname(hostname: str) -> str:
    """Directory name for a store name: ``*.example.com`` → ``_wildcard.example.com``."""
    if hostname.startswith("*."):
        return WILDCARD_PREFIX + hostname[2:]
    return hostname


def _stat_sig(path: Path) -> StatSig:
    st = os.stat(path)  # follows symlinks: certbot's live/ links change target on renewal
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class CertStore:
    """Per-SNI certificate lookup with a stat-revalidated cache, and the bootstrap certificate behind it.

    ``clock`` (wall time, for validity) and ``monotonic`` (for the revalidation interval) are injectable
    so tests can move time instead of sleeping. Counters and hooks are plain attributes.
    """

    cert_dir: str | os.PathLike[str]
    state_dir: str | os.PathLike[str]
    revalidate_s: float = 1.0
    bootstrap_validity_s: float = 24 * 3600  # the bootstrap certificate's (BootstrapCert)
    bootstrap_renew_fraction: float = 0.25
    bootstrap_names: tuple[str, ...] = ("localhost",)
    max_entries: int = 10_000  # bounds the cache against random-SNI floods
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic

    # Hooks: called with (directory name, reason) once per unusable file version / with each new cert.
    on_unusable: Callable[[str, str], None] | None = None
    on_loaded: Callable[[ServerCert], None] | None = None
    on_expiring: Callable[[ServerCert, float], None] | None = None  # (certificate, seconds left), once each
    expiry_warning_s: float = 7 * 86400

    # Counters.
    stats: int = field(default=0, init=False)  # stat() calls made by revalidation
    loads: int = field(default=0, init=False)  # pairs read and validated successfully
    unusable: int = field(default=0, init=False)  # unusable file versions seen (each logged once)
    expiring: int = field(default=0, init=False)  # certificates in use found with < expiry_warning_s left

    _entries: dict[str, _Entry] = field(default_factory=dict, init=False, repr=False)
    bootstrap_cert: BootstrapCert = field(init=False, repr=False)  # its counters: generated, loaded, ...
    _expiry_warned: set[str] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        self._cert_dir = Path(self.cert_dir)
        self.bootstrap_cert = BootstrapCert(
            self.state_dir,
            validity_s=self.bootstrap_validity_s,
            renew_fraction=self.bootstrap_renew_fraction,
            names=self.bootstrap_names,
            clock=self.clock,
        )

    # -- lookups -----------------------------------------------------------------------------------

    def lookup(self, sni: str | bytes | None) -> ServerCert | None:
        """The store certificate for ``sni``: exact name first, then ``*.<parent>``; None if neither is
        usable (the caller then serves ``bootstrap()``)."""
        name = normalize_hostname(sni)
        if name is None:
            return None
        cert = self._get(name)
        if cert is not None:
            return cert
        parent = name.partition(".")[2]
        if "." not in parent:  # no "*.com"
            return None
        return self._get(WILDCARD_PREFIX + parent)

    def select(self, sni: str | bytes | None) -> ServerCert:
        """What a handshake serves: the store certificate, else the bootstrap certificate."""
        return self.lookup(sni) or self.bootstrap_cert.current()

    def bootstrap(self) -> ServerCert:
        """The bootstrap certificate (``BootstrapCert.current``): reused, renewed or generated as needed."""
        return self.bootstrap_cert.current()

    def invalidate(self, dirname: str | None = None) -> None:
        """Forget cached answers (one directory name, or all) so the next lookup re-reads the files."""
        if dirname is None:
            self._entries.clear()
        else:
            self._entries.pop(dirname, None)

    def _get(self, dirname: str) -> ServerCert | None:
        now_m = self.monotonic()
        entry = self._entries.get(dirname)
        if entry is not None and now_m - entry.checked < self.revalidate_s:
            return entry.cert  # fresh: no system call at all
        return self._revalidate(dirname, entry, now_m)

    def _revalidate(self, dirname: str, entry: _Entry | None, now_m: float) -> ServerCert | None:
        d = self._cert_dir / dirname
        self.stats += 1
        try:
            sig: tuple[StatSig, StatSig] | None = (_stat_sig(d / FULLCHAIN), _stat_sig(d / PRIVKEY))
        except OSError:
            sig = None
        if entry is not None and sig == entry.sig:
            entry.checked = now_m
            if entry.cert is not None:
                now = self.clock()
                if now >= entry.cert.not_after:
                    self._report_unusable(dirname, "expired while in use")
                    entry.cert = None
                else:
                    self._check_expiry(entry.cert, now)
            return entry.cert
        cert = None
        if sig is not None:
            try:
                chain_pem, chain_sig = read_file(d / FULLCHAIN)
                key_pem, key_sig = read_file(d / PRIVKEY)
                sig = (chain_sig, key_sig)
                name = "*." + dirname[len(WILDCARD_PREFIX) :] if dirname.startswith(WILDCARD_PREFIX) else dirname
                cert = parse_pair(name, chain_pem, key_pem, self.clock())
            except OSError as exc:
                sig = None  # vanished between stat and open: look again next time
                log.debug("cert store: %s unreadable: %s", dirname, exc)
            except UnusableCertificate as exc:
                self._report_unusable(dirname, str(exc))
            else:
                self.loads += 1
                previous = entry.cert if entry is not None else None
                # a new file version for a name already served is the hot swap operators look for
                event(
                    "certificate_swapped" if previous is not None else "certificate_loaded",
                    name=cert.name,
                    sha256=cert.fingerprint[:16],
                    previous_sha256=previous.fingerprint[:16] if previous is not None else None,
                    not_after=cert.leaf.not_valid_after_utc.isoformat(),
                )
                if self.on_loaded is not None:
                    self.on_loaded(cert)
                self._check_expiry(cert, self.clock())
        if entry is None and len(self._entries) >= self.max_entries:
            self._evict()
        self._entries[dirname] = _Entry(cert, sig, now_m)
        return cert

    def _evict(self) -> None:
        # Negative answers are the cheap ones to lose (random-SNI floods create them); then the oldest.
        for k in [k for k, e in self._entries.items() if e.cert is None]:
            del self._entries[k]
        while len(self._entries) >= self.max_entries:
            del self._entries[next(iter(self._entries))]

    def _report_unusable(self, dirname: str, reason: str) -> None:
        # Loud by design: the pair is present, the operator expects it served, and the bootstrap (or an
        # older pair) answers instead. Once per file version, so a flood of handshakes adds no lines.
        self.unusable += 1
        event("cert_rejected", "warning", certificate=dirname, reason=reason)
        if self.on_unusable is not None:
            self.on_unusable(dirname, reason)

    def _check_expiry(self, cert: ServerCert, now: float) -> None:
        """Warn once per certificate (fingerprint) when one in use has less than ``expiry_warning_s`` left.
        The bootstrap certificate lives 24 h and renews itself: it is never warned about."""
        left = cert.not_after - now
        if cert.bootstrap or left >= self.expiry_warning_s or cert.fingerprint in self._expiry_warned:
            return
        if len(self._expiry_warned) >= self.max_entries:
            self._expiry_warned.clear()
        self._expiry_warned.add(cert.fingerprint)
        self.expiring += 1
        event(
            "cert_expiring",
            "warning",
            certificate=cert.name,
            expires_in_s=int(left),
            not_after=cert.leaf.not_valid_after_utc.isoformat(),
            sha256=cert.fingerprint[:16],
        )
        if self.on_expiring is not None:
            self.on_expiring(cert, left)

    # -- expiry, for /metrics ------------------------------------------------------------------------

    def expiry(self) -> list[CertExpiry]:
        """Every certificate this store can serve now: each store directory (validated through the same
        stat-revalidated cache as handshakes) and the bootstrap certificate when one exists on disk. Reads
        only: it never generates a bootstrap certificate, so the mgmt process may call it on its own store.
        """
        out: list[CertExpiry] = []
        try:
            names = sorted(e.name for e in os.scandir(self._cert_dir) if e.is_dir() and not e.name.startswith("."))
        except OSError:
            names = []
        for dirname in names:
            cert = self._get(dirname)
            if cert is not None:
                out.append(CertExpiry(cert.name, "store", cert.not_after))
        boot = self.bootstrap_cert.on_disk()
        if boot is not None:
            out.append(CertExpiry(boot.name, "bootstrap", boot.not_after))
        return out
