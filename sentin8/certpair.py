"""A certificate/key pair as the edge serves it: ML-DSA-65 only, validated the way OpenSSL will load it, and
written atomically. What the store (``certstore.py``) and the bootstrap certificate (``bootstrap_cert.py``)
share; no state of its own.

Layout of one pair directory (certbot style, ARCHITECTURE.md §5): ``fullchain.pem`` (leaf first) and
``privkey.pem`` (PKCS#8, mode 0600).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import mldsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from OpenSSL import crypto

from .atomic_file import write_atomic

FULLCHAIN = "fullchain.pem"
PRIVKEY = "privkey.pem"

StatSig = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns


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


def _fstat_sig(fd: int) -> StatSig:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def read_file(path: Path) -> tuple[bytes, StatSig]:
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
            raise UnusableCertificate(f"private key does not parse: {openssl_reason(exc)}") from None
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


def openssl_reason(exc: Exception) -> str:
    """An OpenSSL error's (library, function, reason) list as the reasons alone, each once."""
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


def write_pair(directory: str | os.PathLike[str], chain: Sequence[x509.Certificate], key: object) -> None:
    """Write ``fullchain.pem`` and ``privkey.pem`` (mode 0600) into ``directory``, each atomically.

    The key goes first: a reader that catches the pair between the two renames sees a key/leaf mismatch
    and treats the pair as unusable for now, which is safe."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    key_pem = key.private_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    write_atomic(d / PRIVKEY, key_pem, 0o600)
    write_atomic(d / FULLCHAIN, b"".join(c.public_bytes(serialization.Encoding.PEM) for c in chain), 0o644)
    with contextlib.suppress(OSError):  # make the renames durable; not every file system allows it
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
