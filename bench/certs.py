"""One ML-DSA-65 certificate for every TLS terminator in the run (nginx, HAProxy, sentin8, the backends)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from sentin8.certpair import self_signed_mldsa65


@dataclass(frozen=True)
class CertFiles:
    cert: Path  # PEM certificate
    key: Path  # PEM PKCS#8 private key
    combined: Path  # certificate then key, as HAProxy's ``crt`` wants


def write_mldsa65(directory: Path, names: list[str]) -> CertFiles:
    """A self-signed ML-DSA-65 leaf for ``names`` (valid a day: a bench run is minutes), built by the same
    code that makes the proxy's bootstrap certificate."""
    now = time.time()
    cert, key = self_signed_mldsa65(names, now - 300, now + 86400)
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
