"""Certificates as real tools write them: ML-DSA-65 pairs from the OpenSSL 3.5 CLI, in every private-key form
it writes, hot-swapped into the store and served over real PQ TLS; broken pairs reported, not skipped."""

from __future__ import annotations

import base64
import mmap
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import mldsa

from sentin8 import tls
from sentin8.certpair import UnusableCertificate, parse_pair
from sentin8.certstore import CertExpiry, CertStore, expiry_metric_lines
from sentin8.shm import certreport
from tests import openssl_cli
from tests.test_tls import ServerThread, put_cert

FIXTURES = openssl_cli.FIXTURES


class Mono:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def mono() -> Mono:
    return Mono()


@pytest.fixture
def store(tmp_path: Path, mono: Mono) -> CertStore:
    return CertStore(tmp_path / "certs", tmp_path / "state", monotonic=mono)


@pytest.fixture
def server(store: CertStore) -> Iterator[ServerThread]:
    s = ServerThread(tls.SNIContexts(store).front)
    yield s
    s.stop()


def served_fingerprint(server: ServerThread, sni: str) -> str:
    client = server.client(sni)
    client.handshake()
    cert = client.peer_cert
    client.close()
    assert cert is not None
    return cert.fingerprint(hashes.SHA256()).hex()


def fixture_fingerprint(form: str) -> str:
    return (
        x509.load_pem_x509_certificate((FIXTURES / form / "fullchain.pem").read_bytes())
        .fingerprint(hashes.SHA256())
        .hex()
    )


@pytest.mark.parametrize("form", openssl_cli.FORMS)
def test_openssl_cli_pair_is_hot_swapped_in_whatever_the_key_form(
    form: str, store: CertStore, server: ServerThread, mono: Mono
) -> None:
    host = openssl_cli.fixture_hostname(form)
    bootstrap = store.bootstrap().fingerprint
    assert served_fingerprint(server, host) == bootstrap  # nothing in the store yet
    shutil.copytree(FIXTURES / form, Path(store.cert_dir) / host)  # the operator drops the pair in
    mono.now += store.revalidate_s
    assert served_fingerprint(server, host) == fixture_fingerprint(form)
    assert store.unusable == 0


def test_cryptography_seed_only_pair_still_loads(store: CertStore, server: ServerThread) -> None:
    fp = put_cert(Path(store.cert_dir), "crypto.example.test", ["crypto.example.test"])
    assert served_fingerprint(server, "crypto.example.test") == fp


def _der(pem: bytes) -> bytes:
    body = b"".join(line for line in pem.splitlines() if not line.startswith(b"-----"))
    return base64.b64decode(body)


def _pem(der: bytes) -> bytes:
    b64 = base64.encodebytes(der).replace(b"\n", b"")
    lines = [b64[i : i + 64] for i in range(0, len(b64), 64)]
    return b"-----BEGIN PRIVATE KEY-----\n" + b"\n".join(lines) + b"\n-----END PRIVATE KEY-----\n"


def test_seed_and_expanded_key_that_disagree_are_rejected() -> None:
    chain = (FIXTURES / "seed-priv" / "fullchain.pem").read_bytes()
    der = bytearray(_der((FIXTURES / "seed-priv" / "privkey.pem").read_bytes()))
    seed_at = der.index(bytes.fromhex("0420")) + 2  # the first OCTET STRING(32) in the key: the seed
    der[seed_at : seed_at + 32] = os.urandom(32)
    with pytest.raises(UnusableCertificate, match="private key does not parse"):  # OpenSSL: "invalid key"
        parse_pair("x", chain, _pem(bytes(der)), time.time())


def test_key_of_another_pair_is_a_mismatch_whatever_the_form() -> None:
    chain = (FIXTURES / "seed-only" / "fullchain.pem").read_bytes()
    key = (FIXTURES / "priv-only" / "privkey.pem").read_bytes()
    with pytest.raises(UnusableCertificate, match="does not match"):
        parse_pair("x", chain, key, time.time())


@pytest.mark.skipif(openssl_cli.find_openssl35() is None, reason="no OpenSSL >= 3.5 CLI on this machine")
@pytest.mark.parametrize("form", openssl_cli.FORMS)
def test_freshly_made_openssl_cli_pairs_load(form: str, tmp_path: Path) -> None:
    """The committed fixtures stand for what the tool writes today: remake them and check again."""
    openssl = openssl_cli.find_openssl35()
    assert openssl is not None
    openssl_cli.make_pair(openssl, form, "fresh.example.test", tmp_path)
    cert = parse_pair(
        "fresh.example.test",
        (tmp_path / "fullchain.pem").read_bytes(),
        (tmp_path / "privkey.pem").read_bytes(),
        time.time(),
    )
    assert isinstance(cert.leaf.public_key(), mldsa.MLDSA65PublicKey)
    tls.server_context(cert)  # and the TLS side takes it


def test_rejected_pairs_are_reported_per_worker_and_cleared_when_fixed() -> None:
    mm = mmap.mmap(-1, certreport.region_bytes(2), flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    view = memoryview(mm)
    w0, w1 = certreport.CertReportWriter(view, 0), certreport.CertReportWriter(view, 1)
    assert certreport.read_rejected(view, 2) == {}
    w0.rejected("a.example.test", "private key does not match the leaf certificate", at=10.0)
    w1.rejected("a.example.test", "private key does not match the leaf certificate", at=12.0)
    w1.rejected("b.example.test", "expired at 2020-01-01T00:00:00+00:00", at=11.0)
    got = certreport.read_rejected(view, 2)
    assert got == {
        "a.example.test": {"reason": "private key does not match the leaf certificate", "at": 12.0},
        "b.example.test": {"reason": "expired at 2020-01-01T00:00:00+00:00", "at": 11.0},
    }
    w0.usable("a.example.test")
    w1.usable("a.example.test")
    assert list(certreport.read_rejected(view, 2)) == ["b.example.test"]
    for i in range(100):  # a flood of broken names stays within the slot
        w0.rejected(f"n{i}.example.test" + "x" * 200, "r" * 500)
    assert len(certreport.read_rejected(view, 2)) <= 2 * 16 + 1


def test_expiry_lists_store_and_bootstrap_and_warns_under_seven_days(
    store: CertStore, mono: Mono, capsys: pytest.CaptureFixture[str]
) -> None:
    now = time.time()
    put_cert(Path(store.cert_dir), "long.example.test", ["long.example.test"])  # 1 h left
    store.bootstrap()
    capsys.readouterr()
    assert store.lookup("long.example.test") is not None
    err = capsys.readouterr().err
    assert '"event":"cert_expiring"' in err and "long.example.test" in err
    assert store.expiring == 1
    mono.now += store.revalidate_s
    store.lookup("long.example.test")
    assert store.expiring == 1  # once per certificate, not per handshake
    rows = {(c.hostname, c.source): c for c in store.expiry()}
    assert set(rows) == {("long.example.test", "store"), ("bootstrap", "bootstrap")}
    assert 3000 < rows["long.example.test", "store"].seconds_left(now) <= 3600
    lines = expiry_metric_lines([CertExpiry("a.example.test", "store", now + 100.4)], now)
    assert lines[-1] == 'sentin8_certificate_expiry_seconds{hostname="a.example.test",source="store"} 100'
    assert lines[1] == "# TYPE sentin8_certificate_expiry_seconds gauge"
    # A fresh store in another process (mgmt) reads the bootstrap from disk without generating one.
    other = CertStore(store.cert_dir, store.state_dir)
    assert {c.source for c in other.expiry()} == {"store", "bootstrap"}
    assert other.bootstrap_cert.generated == 0


def test_tls_health_field_reads_what_workers_report(tmp_path: Path) -> None:
    from sentin8.config import load_bytes
    from sentin8.shm.state import SharedState

    shared = SharedState(load_bytes(b""), worker_slots=2)
    assert shared.tls_health() == {"certificates_rejected": 0, "rejected": {}, "ticket_key_rotation_s": 3600}
    shared.cert_report_writer(1).rejected("a.example.test", "expired at 2020-01-01T00:00:00+00:00", at=5.0)
    health = shared.tls_health()
    assert health["certificates_rejected"] == 1
    assert health["rejected"] == {"a.example.test": {"reason": "expired at 2020-01-01T00:00:00+00:00", "at": 5.0}}
