"""The certificate store without sockets: lookups, stat revalidation, unusable files, bootstrap lifecycle.

Time is injected (``clock``/``monotonic``); nothing sleeps. Handshake-level behaviour (per-SNI choice and
hot swap over real connections) is in test_tls.py.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import multiprocessing
import os
import stat
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import NameOID

from sentin8 import certstore
from sentin8.certpair import FULLCHAIN, PRIVKEY, UnusableCertificate, parse_pair, self_signed_mldsa65, write_pair
from sentin8.certstore import CertStore, normalize_hostname

HOUR = 3600.0


class Clock:
    def __init__(self) -> None:
        self.wall = time.time()
        self.mono = 1000.0

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> CertStore:
    return CertStore(tmp_path / "certs", tmp_path / "state", clock=clock.time, monotonic=clock.monotonic)


def put(store: CertStore, dirname: str, names: list[str], *, start: float = -60, end: float = HOUR) -> str:
    now = store.clock()
    cert, key = self_signed_mldsa65(names, now + start, now + end)
    write_pair(Path(store.cert_dir) / dirname, [cert], key)
    return cert.fingerprint(hashes.SHA256()).hex()


def put_classical(store: CertStore, dirname: str) -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dirname)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .sign(key, None)
    )
    write_pair(Path(store.cert_dir) / dirname, [cert], key)


# -- names -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("Shop.Example.COM.", "shop.example.com"),
        (b"a-b.example.com", "a-b.example.com"),
        ("localhost", "localhost"),
        (None, None),
        ("", None),
        ("../etc", None),
        ("a/b.example.com", None),
        ("a..example.com", None),
        (".example.com", None),
        ("_wildcard.example.com", None),  # the wildcard directory is not reachable as a literal name
        ("*.example.com", None),
        ("-a.example.com", None),
        ("ex\u00e4mple.com", None),
        (b"\xff.example.com", None),
        ("a" * 64 + ".com", None),
        (("a" * 63 + ".") * 4 + "com", None),  # over 253
    ],
)
def test_normalize_hostname(raw: str | bytes | None, want: str | None) -> None:
    assert normalize_hostname(raw) == want


def test_normalize_hostname_answers_the_same_the_second_time_and_its_memo_stays_bounded() -> None:
    # Asked per handshake, the answer is remembered per raw name: a remembered answer is the first one, for
    # valid and invalid names, str and bytes alike; a flood of distinct names never grows the memo past its cap.
    names = ["Shop.Example.COM.", b"shop.example.com", "../etc", b"\xff.example.com", "", "*.example.com"]
    first = [normalize_hostname(n) for n in names]
    assert [normalize_hostname(n) for n in names] == first == [
        "shop.example.com", "shop.example.com", None, None, None, None,
    ]
    for i in range(certstore._NAMES_KEPT * 2 + 7):
        assert normalize_hostname(f"h{i}.Example.com") == f"h{i}.example.com"
        assert len(certstore._names) <= certstore._NAMES_KEPT
    assert [normalize_hostname(n) for n in names] == first  # forgotten and asked again: the same answers


def test_exact_then_wildcard(store: CertStore) -> None:
    exact = put(store, "a.example.test", ["a.example.test"])
    wild = put(store, "_wildcard.example.test", ["*.example.test"])
    assert store.lookup("a.example.test").fingerprint == exact  # type: ignore[union-attr]
    assert store.lookup("A.EXAMPLE.TEST.").fingerprint == exact  # type: ignore[union-attr]
    hit = store.lookup("b.example.test")
    assert hit is not None and hit.fingerprint == wild and hit.name == "*.example.test"
    assert store.lookup("x.b.example.test") is None  # one label only
    assert store.lookup("example.test") is None
    assert store.lookup("../certs/a.example.test") is None
    assert store.lookup(None) is None


def test_no_wildcard_for_a_top_level_domain(store: CertStore) -> None:
    put(store, "_wildcard.test", ["*.test"])
    assert store.lookup("a.test") is None


def test_fresh_cache_makes_no_system_call(store: CertStore, clock: Clock) -> None:
    put(store, "a.example.test", ["a.example.test"])
    assert store.lookup("a.example.test") is not None
    assert store.lookup("nothing.example.test") is None
    stats = store.stats
    for _ in range(100):
        store.lookup("a.example.test")
        store.lookup("nothing.example.test")
    assert store.stats == stats
    clock.mono += store.revalidate_s
    store.lookup("a.example.test")
    assert store.stats == stats + 1
    assert store.loads == 1  # unchanged files are not re-read


def test_changed_and_new_files_are_picked_up(store: CertStore, clock: Clock) -> None:
    assert store.lookup("a.example.test") is None
    first = put(store, "a.example.test", ["a.example.test"])
    assert store.lookup("a.example.test") is None  # the negative answer is still fresh
    clock.mono += store.revalidate_s
    assert store.lookup("a.example.test").fingerprint == first  # type: ignore[union-attr]
    second = put(store, "a.example.test", ["a.example.test"])
    clock.mono += store.revalidate_s
    assert store.lookup("a.example.test").fingerprint == second  # type: ignore[union-attr]
    # Removal is noticed too.
    os.unlink(Path(store.cert_dir) / "a.example.test" / FULLCHAIN)
    clock.mono += store.revalidate_s
    assert store.lookup("a.example.test") is None


def test_certbot_symlink_swap_is_picked_up(store: CertStore, clock: Clock) -> None:
    cert_dir = Path(store.cert_dir)
    fps = [put(store, f"archive{i}", ["a.example.test"]) for i in (1, 2)]
    live = cert_dir / "a.example.test"
    live.mkdir(parents=True)
    for f in (FULLCHAIN, PRIVKEY):
        (live / f).symlink_to(cert_dir / "archive1" / f)
    assert store.lookup("a.example.test").fingerprint == fps[0]  # type: ignore[union-attr]
    for f in (FULLCHAIN, PRIVKEY):
        tmp = live / f"{f}.new"
        tmp.symlink_to(cert_dir / "archive2" / f)
        tmp.replace(live / f)
    clock.mono += store.revalidate_s
    assert store.lookup("a.example.test").fingerprint == fps[1]  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", ["garbage", "classical", "expired", "not_yet_valid", "mismatch", "no_key"])
def test_unusable_certificates_are_skipped_and_logged_once(
    store: CertStore, clock: Clock, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    d = Path(store.cert_dir) / "bad.example.test"
    if kind == "garbage":
        put(store, "bad.example.test", ["bad.example.test"])
        (d / FULLCHAIN).write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n")
    elif kind == "classical":
        put_classical(store, "bad.example.test")
    elif kind == "expired":
        put(store, "bad.example.test", ["bad.example.test"], start=-2 * HOUR, end=-HOUR)
    elif kind == "not_yet_valid":
        put(store, "bad.example.test", ["bad.example.test"], start=HOUR, end=2 * HOUR)
    elif kind == "mismatch":
        put(store, "bad.example.test", ["bad.example.test"])
        put(store, "other", ["other"])
        (d / PRIVKEY).write_bytes((Path(store.cert_dir) / "other" / PRIVKEY).read_bytes())
    elif kind == "no_key":
        put(store, "bad.example.test", ["bad.example.test"])
        (d / PRIVKEY).write_bytes(b"")
    hooked: list[tuple[str, str]] = []
    store.on_unusable = lambda name, reason: hooked.append((name, reason))
    capsys.readouterr()
    for _ in range(3):
        assert store.lookup("bad.example.test") is None
        clock.mono += store.revalidate_s
    assert store.unusable == 1
    assert len(hooked) == 1 and hooked[0][0] == "bad.example.test"
    events = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    rejected = [e for e in events if e["event"] == "cert_rejected"]
    assert len(rejected) == 1  # loud, once per file version: one JSON line with the reason
    assert rejected[0]["certificate"] == "bad.example.test" and rejected[0]["reason"] == hooked[0][1]
    # A wildcard still answers for the name; fixing the files makes the exact one usable again.
    wild = put(store, "_wildcard.example.test", ["*.example.test"])
    assert store.lookup("bad.example.test").fingerprint == wild  # type: ignore[union-attr]
    fixed = put(store, "bad.example.test", ["bad.example.test"])
    clock.mono += store.revalidate_s
    assert store.lookup("bad.example.test").fingerprint == fixed  # type: ignore[union-attr]


def test_certificate_expiring_while_cached_is_dropped(store: CertStore, clock: Clock) -> None:
    put(store, "a.example.test", ["a.example.test"], end=100)
    assert store.lookup("a.example.test") is not None
    clock.wall += 101
    clock.mono += store.revalidate_s
    assert store.lookup("a.example.test") is None
    assert store.unusable == 1


def test_parse_pair_reasons() -> None:
    now = time.time()
    cert, key = self_signed_mldsa65(["a.test"], now - 10, now + 10)
    chain_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    ok = parse_pair("a.test", chain_pem, key_pem, now)
    assert ok.leaf == cert and ok.not_after - ok.not_before == 20
    assert "key_pem" not in repr(ok)  # the private key never lands in logs
    with pytest.raises(UnusableCertificate, match="fullchain"):
        parse_pair("a.test", b"", key_pem, now)
    with pytest.raises(UnusableCertificate, match="expired"):
        parse_pair("a.test", chain_pem, key_pem, now + 11)


def test_entry_count_is_bounded(store: CertStore) -> None:
    store.max_entries = 16
    put(store, "keep.example.test", ["keep.example.test"])
    assert store.lookup("keep.example.test") is not None
    for i in range(200):
        assert store.lookup(f"random{i}.example.test") is None
    assert len(store._entries) <= 16
    assert store.lookup("keep.example.test") is not None


# -- bootstrap ---------------------------------------------------------------------------------------


def test_bootstrap_generated_with_safe_files(store: CertStore, tmp_path: Path) -> None:
    boot = store.bootstrap()
    assert boot.bootstrap and boot.name == "bootstrap"
    assert boot.not_after - boot.not_before == pytest.approx(24 * HOUR, abs=1)
    assert store.bootstrap_cert.generated == 1
    d = tmp_path / "state" / "bootstrap"
    assert stat.S_IMODE(os.stat(d / PRIVKEY).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert sorted(p.name for p in d.iterdir() if not p.name.startswith(".")) == [FULLCHAIN, PRIVKEY]
    assert store.bootstrap() is boot  # cached, no file access


def test_bootstrap_reused_across_restarts(tmp_path: Path, clock: Clock) -> None:
    def new_store() -> CertStore:
        return CertStore(tmp_path / "certs", tmp_path / "state", clock=clock.time, monotonic=clock.monotonic)

    first = new_store().bootstrap()
    clock.wall += 12 * HOUR  # half its life left: still reused
    again = new_store()
    assert again.bootstrap().fingerprint == first.fingerprint
    assert again.bootstrap_cert.generated == 0 and again.bootstrap_cert.loaded == 1


def test_bootstrap_renewed_when_less_than_a_quarter_remains(tmp_path: Path, clock: Clock) -> None:
    store = CertStore(
        tmp_path / "certs",
        tmp_path / "state",
        bootstrap_validity_s=100,
        clock=clock.time,
        monotonic=clock.monotonic,
    )
    start = clock.wall
    first = store.bootstrap()
    clock.wall = start + 74  # 26 % left
    assert store.bootstrap() is first
    clock.wall = start + 76  # 24 % left
    renewed = store.bootstrap()
    assert renewed.fingerprint != first.fingerprint
    assert renewed.not_after >= start + 76 + 99
    assert store.bootstrap_cert.generated == 2
    # The renewed pair is what the next restart (or a sibling worker) picks up.
    sibling = CertStore(tmp_path / "certs", tmp_path / "state", bootstrap_validity_s=100, clock=clock.time)
    assert sibling.bootstrap().fingerprint == renewed.fingerprint


def test_corrupt_bootstrap_is_regenerated(tmp_path: Path, store: CertStore) -> None:
    first = store.bootstrap()
    (tmp_path / "state" / "bootstrap" / FULLCHAIN).write_bytes(b"junk")
    fresh = CertStore(tmp_path / "certs", tmp_path / "state")
    second = fresh.bootstrap()
    assert second.fingerprint != first.fingerprint
    assert fresh.bootstrap_cert.generated == 1


def test_select_hot_swaps_from_bootstrap_to_store(store: CertStore, clock: Clock) -> None:
    boot = store.select("new.example.test")
    assert boot.bootstrap
    real = put(store, "new.example.test", ["new.example.test"])
    clock.mono += store.revalidate_s
    chosen = store.select("new.example.test")
    assert not chosen.bootstrap and chosen.fingerprint == real
    assert store.select("unknown.example.test") is boot


def _race_bootstrap(state_dir: str, barrier: multiprocessing.synchronize.Barrier, out: multiprocessing.Queue) -> None:
    store = CertStore(Path(state_dir) / "certs", state_dir)
    barrier.wait()
    out.put((store.bootstrap().fingerprint, store.bootstrap_cert.generated))


def test_racing_workers_converge_on_one_bootstrap(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    n = 4
    barrier = ctx.Barrier(n)
    out = ctx.Queue()
    procs = [ctx.Process(target=_race_bootstrap, args=(str(tmp_path), barrier, out)) for _ in range(n)]
    for p in procs:
        p.start()
    got = [out.get(timeout=60) for _ in range(n)]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    on_disk = CertStore(tmp_path / "certs", tmp_path).bootstrap().fingerprint
    assert {fingerprint for fingerprint, _ in got} == {on_disk}
    assert sum(generated for _, generated in got) == 1  # one generated it, the others loaded it


def test_unwritable_state_dir_still_serves_a_bootstrap(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "not-a-dir").write_bytes(b"")
    store = CertStore(tmp_path / "certs", tmp_path / "not-a-dir" / "state")
    with caplog.at_level(logging.ERROR, logger="sentin8.bootstrap_cert"):
        boot = store.bootstrap()
    assert boot.bootstrap
    assert store.bootstrap_cert.write_errors == 1
    assert store.bootstrap() is boot  # kept in memory, not regenerated per handshake
    assert any("cannot persist" in r.getMessage() for r in caplog.records)
