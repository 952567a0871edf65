"""The bootstrap certificate: the self-signed ML-DSA-65 default a handshake gets when the store has no
certificate for its name (or the client sent none), and its life cycle.

It lives in ``<state_dir>/bootstrap/`` (``fullchain.pem`` + ``privkey.pem``, ``certpair`` layout) and is
reused while valid, renewed lazily when less than ``renew_fraction`` of its validity remains, generated when
missing or unusable. Several processes share the files: a sibling's pair is read first without a lock, and a
new one is written under an ``flock`` on ``.lock`` (released by the kernel if the holder dies), re-checked
once the lock is held, so racing workers converge on one pair. An unwritable ``state_dir`` never takes TLS
down: the process serves a pair of its own from memory and tries to persist again at the next renewal.

One ``BootstrapCert`` per ``CertStore`` (which is its only user), used from one thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from .certpair import (
    FULLCHAIN,
    PRIVKEY,
    ServerCert,
    UnusableCertificate,
    parse_pair,
    read_file,
    self_signed_mldsa65,
    write_pair,
)
from .eventlog import event

log = logging.getLogger(__name__)

BOOTSTRAP_DIR = "bootstrap"
BOOTSTRAP_NAME = "bootstrap"


class BootstrapCert:
    """``current()`` is what a handshake serves when the store has nothing; ``on_disk()`` what /metrics reports.

    Counters (plain attributes): ``generated`` (pairs this process generated), ``loaded`` (pairs read from
    disk: a previous run's or a sibling's), ``write_errors`` (state_dir unwritable: served from memory)."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        validity_s: float = 24 * 3600,
        renew_fraction: float = 0.25,
        names: Sequence[str] = ("localhost",),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = Path(state_dir) / BOOTSTRAP_DIR
        self.validity_s = validity_s
        self.renew_fraction = renew_fraction  # renew when less than this share of the validity remains
        self.names = tuple(names)
        self.clock = clock
        self.generated = 0
        self.loaded = 0
        self.write_errors = 0
        self._cert: ServerCert | None = None

    def current(self) -> ServerCert:
        """The default certificate: the one in memory while it needs no renewal, else refreshed from disk or
        generated."""
        cert = self._cert
        if cert is not None and not self._needs_renewal(cert, self.clock()):
            return cert
        return self._refresh()

    def on_disk(self) -> ServerCert | None:
        """The certificate this process serves, or else the one on disk if any; never generates one (the mgmt
        process reports it without serving it)."""
        if self._cert is not None:
            return self._cert
        with contextlib.suppress(OSError, UnusableCertificate):
            return self._read(self.clock())
        return None

    def _needs_renewal(self, cert: ServerCert, now: float) -> bool:
        return cert.not_after - now < self.renew_fraction * (cert.not_after - cert.not_before)

    def _read(self, now: float) -> ServerCert:
        chain_pem, _ = read_file(self.directory / FULLCHAIN)
        key_pem, _ = read_file(self.directory / PRIVKEY)
        return parse_pair(BOOTSTRAP_NAME, chain_pem, key_pem, now, bootstrap=True)

    def _load(self, now: float) -> ServerCert | None:
        try:
            cert = self._read(now)
        except (OSError, UnusableCertificate):
            return None  # missing, half-renewed by a sibling, or stale: the locked path decides
        return None if self._needs_renewal(cert, now) else cert

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        # flock is released by the kernel if the holder dies, so a crashed worker cannot wedge the others.
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _refresh(self) -> ServerCert:
        now = self.clock()
        cert = self._load(now)  # lock-free fast path: a previous run or a sibling wrote it
        if cert is None:
            try:
                with self._lock():
                    cert = self._load(now)  # a sibling may have won the race while we waited
                    if cert is None:
                        cert = self._generate(now, persist=True)
                        self.generated += 1
                    else:
                        self.loaded += 1
            except OSError as exc:
                # An unwritable state_dir must not take TLS down: serve an in-memory certificate (each
                # process its own) and keep trying to persist at the next renewal.
                self.write_errors += 1
                log.error("cert store: cannot persist the bootstrap certificate in %s: %s", self.directory, exc)
                cert = self._generate(now, persist=False)
                self.generated += 1
        else:
            self.loaded += 1
        previous = self._cert
        if previous is None or cert.fingerprint != previous.fingerprint:
            event(
                "certificate_bootstrap",
                sha256=cert.fingerprint[:16],
                previous_sha256=previous.fingerprint[:16] if previous is not None else None,
                not_after=cert.leaf.not_valid_after_utc.isoformat(),
            )
        self._cert = cert
        return cert

    def _generate(self, now: float, *, persist: bool) -> ServerCert:
        leaf, key = self_signed_mldsa65(
            self.names,
            now,
            now + self.validity_s,
            common_name=f"sentin8-proxy bootstrap {secrets.token_hex(4)}",
        )
        if persist:
            write_pair(self.directory, [leaf], key)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        chain_pem = leaf.public_bytes(serialization.Encoding.PEM)
        return parse_pair(BOOTSTRAP_NAME, chain_pem, key_pem, now, bootstrap=True)
