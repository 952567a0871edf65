"""The certificate store: which ML-DSA-65 certificate answers a TLS server name.

Layout (certbot style, ARCHITECTURE.md §5)::

    <cert_dir>/<hostname>/fullchain.pem + privkey.pem       exact name
    <cert_dir>/_wildcard.<domain>/fullchain.pem + ...        *.<domain> (one label, as in X.509)
    <state_dir>/bootstrap/fullchain.pem + privkey.pem       the generated default certificate

``lookup`` runs on the handshake path, so it is built to be cheap: each name's answer (a certificate or
"none here") is cached and re-validated by ``stat`` at most once per ``revalidate_s``; a changed file
(mtime, size, inode: certbot swaps symlinks) is re-read, so renewals and new names are picked up without a
restart and without watcher threads. An unusable file (not ML-DSA-65, expired, key mismatch, unparsable) is
logged once per file version and skipped.

One ``CertStore`` per process, used from one thread (the worker's event loop): it holds no locks of its own.
Several processes share the bootstrap files through an ``flock`` so that racing workers converge on one pair.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import logging
import os
import re
import secrets
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import mldsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from OpenSSL import crypto

from sentin8.eventlog import event

log = logging.getLogger(__name__)

FULLCHAIN = "fullchain.pem"
PRIVKEY = "privkey.pem"
WILDCARD_PREFIX = "_wildcard."
BOOTSTRAP_DIR = "bootstrap"
BOOTSTRAP_NAME = "bootstrap"

# LDH host names only: the SNI is attacker-controlled and becomes a path, so "/", "..", "_" and
# anything non-ASCII are refused before touching the file system.
_HOSTNAME_RE = re.compile(
    r"(?=.{1,253}\Z)(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z"
)

_StatSig = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns


class UnusableCertificate(Exception):
    """A certificate/key pair that must not be served; the message says why."""


@dataclass(frozen=True, slots=True, eq=False, weakref_slot=True)
class ServerCert:
    """One servable certificate. Identity-hashed and weak-referenceable, so TLS code can cache a context
    per instance and drop it when the store replaces the instance."""

    name: str  # the store name: "shop.example.com", "*.example.com" or "bootstrap"
    chain: tuple[x509.Certificate, ...]  # leaf first
    key_pem: bytes = field(repr=False)  # PKCS#8 PEM: pyOpenSSL loads ML-DSA keys only from PEM/DER
    not_before: float  # unix seconds
    not_after: float
    fingerprint: str  # sha256 of the leaf, hex
    bootstrap: bool = False

    @property
    def leaf(self) -> x509.Certificate:
        return self.chain[0]


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
    sig: tuple[_StatSig, _StatSig] | None  # None: the pair is (partly) missing
    checked: float  # monotonic time of the last stat


def normalize_hostname(name: str | bytes | None) -> str | None:
    """Lower-cased LDH host name without a trailing dot, or None if it cannot name a store directory."""
    if name is None:
        return None
    if isinstance(name, bytes):
        try:
            name = name.decode("ascii")
        except UnicodeDecodeError:
            return None
    name = name.lower().removesuffix(".")
    return name if _HOSTNAME_RE.match(name) else None


def store_dirname(hostname: str) -> str:
    """Directory name for a store name: ``*.example.com`` → ``_wildcard.example.com``."""
    if hostname.startswith("*."):
        return WILDCARD_PREFIX + hostname[2:]
    return hostname


def _stat_sig(path: Path) -> _StatSig:
    st = os.stat(path)  # follows symlinks: certbot's live/ links change target on renewal
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _fstat_sig(fd: int) -> _StatSig:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _read(path: Path) -> tuple[bytes, _StatSig]:
    # The signature comes from the open file so that it describes exactly the bytes we parsed.
    with open(path, "rb") as f:
        return f.read(), _fstat_sig(f.fileno())


def _mldsa65_raw(key: object) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)  # type: ignore[attr-defined]


def load_mldsa65_key(key_pem: bytes) -> tuple[bytes, bytes]:
    """(PKCS#8 PEM as OpenSSL re-writes it, raw public key) of an ML-DSA-65 private key in any form OpenSSL
    writes; raise ``UnusableCertificate`` with the reason otherwise.

    OpenSSL 3.5 writes ML-DSA keys as seed + expanded key by default, or seed only, expanded key only, or
    three non-standard layouts (``ml-dsa.output_formats``); ``cryptography`` loads only seed-only PKCS#8. The
    key is therefore read by the OpenSSL that will serve it (the one bundled with ``cryptography``, through
    pyOpenSSL), which checks that a seed and an expanded key agree, and the public half comes back out as
    SubjectPublicKeyInfo for ``cryptography`` to type-check.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # PKey: the only way in for ML-DSA keys
        try:
            # An empty passphrase: an encrypted key fails here instead of OpenSSL prompting on a terminal.
            pkey = crypto.load_privatekey(crypto.FILETYPE_PEM, key_pem, passphrase=b"")
        except crypto.Error as exc:
            raise UnusableCertificate(f"private key does not parse: {_openssl_reason(exc)}") from None
        public_pem = crypto.dump_publickey(crypto.FILETYPE_PEM, pkey)
        normalized = crypto.dump_privatekey(crypto.FILETYPE_PEM, pkey)
    try:
        public = serialization.load_pem_public_key(public_pem)
    except Exception as exc:  # UnsupportedAlgorithm for key types cryptography does not know
        raise UnusableCertificate(f"private key unsupported: {exc}") from None
    if not isinstance(public, mldsa.MLDSA65PublicKey):
        kind = type(public).__name__.removesuffix("PublicKey").removeprefix("_")
        raise UnusableCertificate(f"private key is {kind}, not ML-DSA-65")
    return normalized, _mldsa65_raw(public)


def _openssl_reason(exc: crypto.Error) -> str:
    errors = exc.args[0] if exc.args and isinstance(exc.args[0], list) else []
    reasons = [e[-1] for e in errors if isinstance(e, tuple) and e and e[-1]]
    return "; ".join(dict.fromkeys(reasons)) or str(exc) or "unknown OpenSSL error"


def parse_pair(name: str, chain_pem: bytes, key_pem: bytes, now: float, *, bootstrap: bool = False) -> ServerCert:
    """Validate a fullchain/privkey pair; raise ``UnusableCertificate`` with the reason if it cannot serve."""
    try:
        chain = tuple(x509.load_pem_x509_certificates(chain_pem))
    except ValueError as exc:
        raise UnusableCertificate(f"fullchain does not parse: {exc}") from None
    if not chain:
        raise UnusableCertificate("fullchain holds no certificate")
    key_pem, key_public = load_mldsa65_key(key_pem)
    leaf = chain[0]
    try:
        leaf_pub = leaf.public_key()
    except Exception as exc:
        raise UnusableCertificate(f"leaf public key unsupported: {exc}") from None
    if not isinstance(leaf_pub, mldsa.MLDSA65PublicKey):
        raise UnusableCertificate(f"leaf key is {type(leaf_pub).__name__}, not ML-DSA-65")
    if _mldsa65_raw(leaf_pub) != key_public:
        raise UnusableCertificate("private key does not match the leaf certificate")
    not_before = leaf.not_valid_before_utc.timestamp()
    not_after = leaf.not_valid_after_utc.timestamp()
    if now >= not_after:
        raise UnusableCertificate(f"expired at {leaf.not_valid_after_utc.isoformat()}")
    if now < not_before:
        raise UnusableCertificate(f"not valid before {leaf.not_valid_before_utc.isoformat()}")
    return ServerCert(
        name=name,
        chain=chain,
        key_pem=key_pem,
        not_before=not_before,
        not_after=not_after,
        fingerprint=leaf.fingerprint(hashes.SHA256()).hex(),
        bootstrap=bootstrap,
    )


def self_signed_mldsa65(
    names: Sequence[str], not_before: float, not_after: float, *, common_name: str | None = None
) -> tuple[x509.Certificate, mldsa.MLDSA65PrivateKey]:
    """A self-signed ML-DSA-65 server leaf for ``names`` (used for bootstrap, demo and tests)."""
    key = mldsa.MLDSA65PrivateKey.generate()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name or names[0])])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(dt.datetime.fromtimestamp(int(not_before), dt.UTC))
        .not_valid_after(dt.datetime.fromtimestamp(int(not_after), dt.UTC))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, None)  # ML-DSA signs without a separate hash
    )
    return cert, key


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    # Temp file in the same directory + rename: readers see the old or the new file, never a torn one.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_pair(directory: str | os.PathLike[str], chain: Sequence[x509.Certificate], key: object) -> None:
    """Write ``fullchain.pem`` and ``privkey.pem`` (mode 0600) into ``directory``, each atomically.

    The key goes first: a reader that catches the pair between the two renames sees a key/leaf mismatch
    and treats the pair as unusable for now, which is safe."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    key_pem = key.private_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _atomic_write(d / PRIVKEY, key_pem, 0o600)
    _atomic_write(d / FULLCHAIN, b"".join(c.public_bytes(serialization.Encoding.PEM) for c in chain), 0o644)
    with contextlib.suppress(OSError):  # make the renames durable; not every file system allows it
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


@dataclass
class CertStore:
    """Per-SNI certificate lookup with a stat-revalidated cache and a self-managed bootstrap certificate.

    ``clock`` (wall time, for validity) and ``monotonic`` (for the revalidation interval) are injectable
    so tests can move time instead of sleeping. Counters and hooks are plain attributes.
    """

    cert_dir: str | os.PathLike[str]
    state_dir: str | os.PathLike[str]
    revalidate_s: float = 1.0
    bootstrap_validity_s: float = 24 * 3600
    bootstrap_renew_fraction: float = 0.25  # renew when less than this share of the validity remains
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
    bootstrap_generated: int = field(default=0, init=False)  # bootstrap pairs this process generated
    bootstrap_write_errors: int = field(default=0, init=False)  # state_dir unwritable: served from memory
    bootstrap_loaded: int = field(default=0, init=False)  # bootstrap pairs read from disk (reuse, a sibling's)

    _entries: dict[str, _Entry] = field(default_factory=dict, init=False, repr=False)
    _bootstrap: ServerCert | None = field(default=None, init=False, repr=False)
    _expiry_warned: set[str] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        self._cert_dir = Path(self.cert_dir)
        self._bootstrap_dir = Path(self.state_dir) / BOOTSTRAP_DIR

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
        return self.lookup(sni) or self.bootstrap()

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
            sig: tuple[_StatSig, _StatSig] | None = (_stat_sig(d / FULLCHAIN), _stat_sig(d / PRIVKEY))
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
                chain_pem, chain_sig = _read(d / FULLCHAIN)
                key_pem, key_sig = _read(d / PRIVKEY)
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
        boot = self._bootstrap
        if boot is None:
            with contextlib.suppress(OSError, UnusableCertificate):
                chain_pem, _ = _read(self._bootstrap_dir / FULLCHAIN)
                key_pem, _ = _read(self._bootstrap_dir / PRIVKEY)
                boot = parse_pair(BOOTSTRAP_NAME, chain_pem, key_pem, self.clock(), bootstrap=True)
        if boot is not None:
            out.append(CertExpiry(boot.name, "bootstrap", boot.not_after))
        return out

    # -- bootstrap ---------------------------------------------------------------------------------

    def bootstrap(self) -> ServerCert:
        """The default certificate: reused from ``state_dir`` while valid, renewed lazily when less than
        ``bootstrap_renew_fraction`` of its validity remains, generated when missing or unusable."""
        cert = self._bootstrap
        if cert is not None and not self._needs_renewal(cert, self.clock()):
            return cert
        return self._refresh_bootstrap()

    def _needs_renewal(self, cert: ServerCert, now: float) -> bool:
        return cert.not_after - now < self.bootstrap_renew_fraction * (cert.not_after - cert.not_before)

    def _load_bootstrap(self, now: float) -> ServerCert | None:
        try:
            chain_pem, _ = _read(self._bootstrap_dir / FULLCHAIN)
            key_pem, _ = _read(self._bootstrap_dir / PRIVKEY)
            cert = parse_pair(BOOTSTRAP_NAME, chain_pem, key_pem, now, bootstrap=True)
        except (OSError, UnusableCertificate):
            return None  # missing, half-renewed by a sibling, or stale: the locked path decides
        return None if self._needs_renewal(cert, now) else cert

    @contextlib.contextmanager
    def _bootstrap_lock(self) -> Iterator[None]:
        # flock is released by the kernel if the holder dies, so a crashed worker cannot wedge the others.
        self._bootstrap_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self._bootstrap_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _refresh_bootstrap(self) -> ServerCert:
        now = self.clock()
        cert = self._load_bootstrap(now)  # lock-free fast path: a previous run or a sibling wrote it
        if cert is None:
            try:
                with self._bootstrap_lock():
                    cert = self._load_bootstrap(now)  # a sibling may have won the race while we waited
                    if cert is None:
                        cert = self._generate_bootstrap(now, persist=True)
                        self.bootstrap_generated += 1
                    else:
                        self.bootstrap_loaded += 1
            except OSError as exc:
                # An unwritable state_dir must not take TLS down: serve an in-memory certificate (each
                # process its own) and keep trying to persist at the next renewal.
                self.bootstrap_write_errors += 1
                log.error("cert store: cannot persist the bootstrap certificate in %s: %s", self._bootstrap_dir, exc)
                cert = self._generate_bootstrap(now, persist=False)
                self.bootstrap_generated += 1
        else:
            self.bootstrap_loaded += 1
        if self._bootstrap is None or cert.fingerprint != self._bootstrap.fingerprint:
            event(
                "certificate_bootstrap",
                sha256=cert.fingerprint[:16],
                previous_sha256=self._bootstrap.fingerprint[:16] if self._bootstrap is not None else None,
                not_after=cert.leaf.not_valid_after_utc.isoformat(),
            )
        self._bootstrap = cert
        return cert

    def _generate_bootstrap(self, now: float, *, persist: bool) -> ServerCert:
        leaf, key = self_signed_mldsa65(
            self.bootstrap_names,
            now,
            now + self.bootstrap_validity_s,
            common_name=f"sentin8-proxy bootstrap {secrets.token_hex(4)}",
        )
        if persist:
            write_pair(self._bootstrap_dir, [leaf], key)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        chain_pem = leaf.public_bytes(serialization.Encoding.PEM)
        return parse_pair(BOOTSTRAP_NAME, chain_pem, key_pem, now, bootstrap=True)
