"""ML-DSA-65 certificate pairs made by the ``openssl`` command-line tool (OpenSSL >= 3.5), in every private-key
form it writes, for the certificate-store tests.

OpenSSL 3.5 writes an ML-DSA private key (PKCS#8 PEM) in one of six forms, chosen with
``-provparam ml-dsa.output_formats=FORM``: ``seed-priv`` (its default: seed + expanded key), ``seed-only``,
``priv-only`` (expanded key only), and the non-standard ``bare-seed``, ``bare-priv`` and ``oqskeypair``.

The committed pairs under ``tests/fixtures/openssl35-mldsa65/`` were made by ``python -m tests.openssl_cli``
(Debian 13's OpenSSL 3.5, from the bench toolchain) so the tests run on machines without that tool; the
tests also remake them whenever an OpenSSL >= 3.5 CLI is at hand (``find_openssl35``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

FORMS = ("seed-priv", "seed-only", "priv-only", "bare-seed", "bare-priv", "oqskeypair")
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "openssl35-mldsa65"
BENCH_TREE = Path(os.environ.get("SENTIN8_BENCH_CACHE", "/var/cache/sentin8-bench")) / "trixie"


def _version_ok(argv: list[str]) -> bool:
    try:
        out = subprocess.run([*argv, "version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    m = re.search(r"OpenSSL (\d+)\.(\d+)", out)
    return bool(m) and (int(m[1]), int(m[2])) >= (3, 5)


def find_openssl35() -> list[str] | None:
    """An argv prefix that runs an OpenSSL >= 3.5 CLI: the host's, else the bench tree's through chroot."""
    host = shutil.which("openssl")
    if host and _version_ok([host]):
        return [host]
    tool = BENCH_TREE / "usr" / "bin" / "openssl"
    if tool.exists() and os.geteuid() == 0 and _version_ok(["chroot", str(BENCH_TREE), "openssl"]):
        return ["chroot", str(BENCH_TREE), "openssl"]
    return None


_SCRIPT = """
set -e
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
"$1" genpkey -algorithm ML-DSA-65 -provparam "ml-dsa.output_formats=$2" -out "$d/key.pem"
"$1" req -x509 -new -key "$d/key.pem" -subj "/CN=$3" -addext "subjectAltName=DNS:$3" \
    -addext extendedKeyUsage=serverAuth -days 36500 -out "$d/cert.pem"
cat "$d/key.pem"
echo "--8<--"
cat "$d/cert.pem"
"""


def make_pair(openssl: list[str], form: str, hostname: str, out_dir: Path) -> None:
    """``out_dir/fullchain.pem`` + ``privkey.pem``: a self-signed ML-DSA-65 leaf for ``hostname`` (valid 100
    years, so committed fixtures do not expire), its key in ``form``. The files travel over stdout, so a
    chroot'd tool needs no view of ``out_dir``."""
    *prefix, tool = openssl
    res = subprocess.run([*prefix, "sh", "-c", _SCRIPT, "sh", tool, form, hostname], capture_output=True, timeout=120)
    if res.returncode != 0:
        raise RuntimeError(f"openssl failed: {res.stderr.decode(errors='replace')}")
    key, _, cert = res.stdout.partition(b"--8<--\n")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "privkey.pem").write_bytes(key)
    (out_dir / "fullchain.pem").write_bytes(cert)


def fixture_hostname(form: str) -> str:
    return f"{form}.openssl.test"


def main() -> int:
    openssl = find_openssl35()
    if openssl is None:
        print("no OpenSSL >= 3.5 CLI found (host or bench tree)", file=sys.stderr)
        return 1
    for form in FORMS:
        make_pair(openssl, form, fixture_hostname(form), FIXTURES / form)
        print(f"wrote {FIXTURES / form}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
