"""One ML-DSA-65 certificate for every TLS terminator in the run (nginx, HAProxy, sentin8, the backends)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import mldsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertFiles:
    cert: Path  # PEM certificate
    key: Path  # PEM PKCS#8 private key
    combined: Path  # certificate then key, as HAProxy's ``crt`` wants


def write_mldsa65(directory: Path, names: list[str]) -> CertFiles:
    """A self-signed ML-DSA-65 leaf for ``names`` (valid a day: a bench run is minutes)."""
    key = mldsa.MLDSA65PrivateKey.generate()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, None)  # ML-DSA signs the message itself: no separate hash
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    directory.mkdir(parents=True, exist_ok=True)
    files = CertFiles(directory / "cert.pem", directory / "key.pem", directory / "combined.pem")
    files.cert.write_bytes(cert_pem)
    files.key.write_bytes(key_pem)
    files.key.chmod(0o600)
    files.combined.write_bytes(cert_pem + key_pem)
    files.combined.chmod(0o600)
    return files
