"""The WAF against an attack corpus, through the running proxy: detection and false positives per family, and
the WAF's CPU per request against the WAF off.

    sudo .venv/bin/python -m bench.waf_corpus [--paranoia 1] [--benign 600] [--cpu-requests 400]
    sudo .venv/bin/python -m bench.waf_corpus --corpus own --crs-dir /usr/share/modsecurity-crs/rules \
        --crs-dir ../shared/crs/v4.28.0/rules      # the repo's corpus, one fleet per CRS release

**Own corpus** (``--corpus own``): ``tests/waf_corpus.py``, the corpus ``tests/test_waf_corpus.py`` replays
sans-IO, here sent as whole requests through the proxy (attacks by family in every place a client puts them,
benign API, form, upload, cookie and header traffic). Each ``--crs-dir`` gets its own fleet.

**Corpus**: the injection wordlists of Debian's ``wfuzz`` package (``Injections/SQL.txt``, ``XSS.txt``,
``Traversal.txt``), taken from the .deb with ``apt-get download`` + ``dpkg-deb -x`` into
``/var/cache/sentin8-bench/wfuzz`` (wfuzz itself is not installed). Benign inputs: wfuzz's ``others/names.txt``
and ``general/common.txt`` plus a few realistic values (names with apostrophes, e-mail addresses, prices,
sentences, JSON-ish text). Every payload is sent in four places: a query parameter, a form body, a JSON body
and a cookie, each url- or JSON-encoded as a client would. Blocked = 403 (or 400 for a body the engine could
not parse).

**Path**: two real fleets (``sentin8-proxy run``, 2 workers, loopback counted as external), one with
``policy.waf = true``, one without, in front of a plain HTTP backend, over PQ TLS (X25519MLKEM768) from this
process. **CPU per request**: the fleet's worker processes' CPU time (psutil) over ``--cpu-requests`` requests
on keep-alive connections, WAF on minus WAF off: a GET without body and a 16 KiB form POST.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote, quote_plus

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sentin8 import waf  # noqa: E402
from sentin8.config import Policy  # noqa: E402
from tests.peers import Fleet, HTTPBackend  # noqa: E402 - the way the tests start the real fleet
from tests.pqclient import PQClient  # noqa: E402

CACHE = Path(os.environ.get("SENTIN8_BENCH_CACHE", "/var/cache/sentin8-bench")) / "wfuzz"
HOST = "shop.bench.test"
FAMILIES = {"sqli": "SQL.txt", "xss": "XSS.txt", "traversal": "Traversal.txt"}
REALISTIC = [
    "O'Brien", "D'Angelo", "Jean-Luc Picard", "anne.marie@example.com", "12.50 EUR", "50% off!",
    "Hello, world. How are you?", "C:\\Users\\Public", "path/to/file.txt", "#hashtag", "a & b", "x=1&y=2",
    "The quick brown fox jumps over the lazy dog", "price < 100", "I'm here; you're there", "2024-05-01T10:00:00Z",
    "+1 (555) 010-9999", "SELECT your seat", "drop me a line", "script writer", "<3", "{\"a\": 1}",
]  # fmt: skip


def wordlists() -> Path:
    """The wfuzz wordlist directory, extracted from Debian's package once."""
    root = CACHE / "usr/share/wfuzz/wordlist"
    if root.exists():
        return root
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["apt-get", "download", "wfuzz"], cwd=tmp, check=True, capture_output=True)
        deb = next(Path(tmp).glob("wfuzz_*.deb"))
        subprocess.run(["dpkg-deb", "-x", str(deb), str(CACHE)], check=True)
    return root


def load_corpus(root: Path, benign_n: int) -> tuple[dict[str, list[str]], list[str]]:
    def lines(path: Path) -> list[str]:
        return [ln.rstrip("\r\n") for ln in path.read_text(errors="replace").splitlines() if ln.strip()]

    attacks = {fam: sorted(set(lines(root / "Injections" / name))) for fam, name in FAMILIES.items()}
    benign = REALISTIC + lines(root / "others/names.txt")[: benign_n // 2] + lines(root / "general/common.txt")
    return attacks, benign[:benign_n]


def placements(value: str) -> dict[str, bytes]:
    """The value where a client would put it, encoded as that client would."""
    form = b"q=" + quote_plus(value).encode()
    body_json = json.dumps({"q": value}).encode()
    head = b"Host: " + HOST.encode() + b"\r\n"

    def post(ctype: bytes, body: bytes) -> bytes:
        return b"POST /submit HTTP/1.1\r\n%sContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (
            head, ctype, len(body), body,
        )  # fmt: skip

    return {
        "query": b"GET /search?q=%s HTTP/1.1\r\n%s\r\n" % (quote(value, safe="").encode(), head),
        "form": post(b"application/x-www-form-urlencoded", form),
        "json": post(b"application/json", body_json),
        "cookie": b"GET / HTTP/1.1\r\n%sCookie: q=%s\r\n\r\n" % (head, quote(value, safe="").encode()),
    }


class Client:
    """One keep-alive PQ TLS connection, re-opened when the proxy closes it (every refusal does)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: PQClient | None = None

    def send(self, raw: bytes, head: bool = False) -> int:
        import socket

        for _ in range(2):
            if self.conn is None:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
                self.conn = PQClient(sock, HOST)
                self.conn.handshake()
            try:
                resp = self.conn.request(raw, head=head)
            except (OSError, EOFError, ValueError):
                self.close()
                continue
            head = resp.partition(b"\r\n\r\n")[0]
            if b"\r\nconnection: close" in head.lower():
                self.close()
            return int(head.split(b" ", 2)[1])
        raise RuntimeError("no answer")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def start_fleet(work: Path, backend_port: int, waf: bool, paranoia: int, crs_dir: str = "") -> Fleet:
    work.mkdir(parents=True, exist_ok=True)
    body = (
        f'[[instances]]\nservice = "web"\nid = "web-1"\nhost = "127.0.0.1"\nport = {backend_port}\n'
        f'[[domains]]\nhostname = "{HOST}"\nservice = "web"\n'
    )
    extra = (
        f'[network]\ninternal_cidrs = ["10.0.0.0/8"]\n[policy]\nwaf = {str(waf).lower()}\nwaf_paranoia = {paranoia}\n'
    )
    if crs_dir:
        extra += f'waf_crs_dir = "{Path(crs_dir).resolve()}"\n'

    return Fleet(str(work), body, workers=2, extra=extra)


def worker_cpu(fleet: Fleet) -> float:
    total = 0.0
    for pid in fleet.workers():
        t = psutil.Process(pid).cpu_times()
        total += t.user + t.system
    return total


def cpu_per_request(fleet: Fleet, raw: bytes, n: int) -> tuple[float, float]:
    """(worker CPU µs per request, wall requests/s) over ``n`` requests on 4 keep-alive connections."""
    clients = [Client(fleet.port) for _ in range(4)]
    for c in clients:
        assert c.send(raw) == 200, "warm-up request refused"
    before, t0 = worker_cpu(fleet), time.monotonic()
    for i in range(n):
        status = clients[i % 4].send(raw)
        assert status == 200, status
    wall = time.monotonic() - t0
    cpu = worker_cpu(fleet) - before
    for c in clients:
        c.close()
    return cpu / n * 1e6, n / wall


def own_corpus(client: Client) -> None:
    """``tests/waf_corpus.py`` through the proxy: detection per family and place, benign pass."""
    from tests import waf_corpus

    rows: dict[str, list[int]] = {}
    for case in waf_corpus.attacks():
        row = rows.setdefault(case.family, [0, 0])
        row[0] += 1
        row[1] += client.send(case.raw(HOST), head=case.method == b"HEAD") in (400, 403)
    benign = waf_corpus.benign()
    wrongly = sum(client.send(case.raw(HOST), head=case.method == b"HEAD") in (400, 403) for case in benign)
    print(f"{'family':10} {'cases':>5} {'blocked':>8}")
    for fam, (n, blocked) in rows.items():
        print(f"{fam:10} {n:>5} {blocked / n:>8.1%}")
    total, blocked = sum(r[0] for r in rows.values()), sum(r[1] for r in rows.values())
    print(f"{'detection':10} {total:>5} {blocked / total:>8.1%}")
    print(f"{'benign pass':10} {len(benign):>4} {1 - wrongly / len(benign):>8.1%}\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paranoia", type=int, default=1)
    ap.add_argument("--benign", type=int, default=600)
    ap.add_argument("--cpu-requests", type=int, default=400)
    ap.add_argument("--corpus", choices=("wfuzz", "own"), default="wfuzz")
    ap.add_argument("--crs-dir", action="append", default=[], help="CRS rules directory (repeat: one fleet each)")
    args = ap.parse_args()
    if args.corpus == "own":
        return main_own(args)
    attacks, benign = load_corpus(wordlists(), args.benign)
    backend = HTTPBackend("web")
    work = Path(tempfile.mkdtemp(prefix="sentin8-waf-bench-"))
    fleets = []
    try:
        on = start_fleet(work / "on", backend.port, True, args.paranoia)
        fleets.append(on)
        off = start_fleet(work / "off", backend.port, False, args.paranoia)
        fleets.append(off)
        client = Client(on.port)
        crs_release = waf.crs_layout(waf.settings_from_policy(Policy(waf=True)).crs_dir).version
        print(f"WAF: ModSecurity v3 + OWASP CRS {crs_release}, paranoia {args.paranoia}, anomaly threshold 5")
        print("corpus: Debian wfuzz 3.1.0 Injections/{SQL,XSS,Traversal}.txt; benign: names.txt, common.txt\n")
        print(f"{'family':10} {'payloads':>8} | " + " | ".join(f"{p:>6}" for p in ("query", "form", "json", "cookie")))
        total_blocked = total_sent = 0
        for fam, payloads in attacks.items():
            blocked = dict.fromkeys(("query", "form", "json", "cookie"), 0)
            for value in payloads:
                for where, raw in placements(value).items():
                    if client.send(raw) in (400, 403):
                        blocked[where] += 1
            n = len(payloads)
            total_blocked += sum(blocked.values())
            total_sent += 4 * n
            print(f"{fam:10} {n:>8} | " + " | ".join(f"{blocked[p] / n:>6.1%}" for p in blocked))
        fp = dict.fromkeys(("query", "form", "json", "cookie"), 0)
        for value in benign:
            for where, raw in placements(value).items():
                if client.send(raw) in (400, 403):
                    fp[where] += 1
        n = len(benign)
        print(f"{'benign FP':10} {n:>8} | " + " | ".join(f"{fp[p] / n:>6.1%}" for p in fp))
        print(f"\ndetection over all attack placements: {total_blocked / total_sent:.1%} of {total_sent}")
        print(f"false positives over all benign placements: {sum(fp.values()) / (4 * n):.2%} of {4 * n}\n")
        client.close()
        get = b"GET /api/items?id=42&sort=desc HTTP/1.1\r\nHost: %s\r\nUser-Agent: bench\r\n\r\n" % HOST.encode()
        words = b"+".join([b"ordinary", b"form", b"text", b"with", b"some", b"words"] * 40)  # ~1.2 KB a field
        form_body = b"&".join(b"field%02d=%s" % (i, words) for i in range(16))[:16384]
        form = (
            b"POST /submit HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (HOST.encode(), len(form_body), form_body)
        )
        print(f"{'worker CPU per request':28} {'WAF off':>10} {'WAF on':>10} {'WAF cost':>10}")
        for name, raw in (("GET, no body", get), ("16 KiB form POST", form)):
            cpu_off, _ = cpu_per_request(off, raw, args.cpu_requests)
            cpu_on, _ = cpu_per_request(on, raw, args.cpu_requests)
            print(f"{name:28} {cpu_off:>8.0f}µs {cpu_on:>8.0f}µs {cpu_on - cpu_off:>8.0f}µs")
    finally:
        for f in fleets:
            f.stop()
        backend.close()
    return 0


def main_own(args: argparse.Namespace) -> int:
    """The repo's corpus and the 16 KiB form's WAF cost, for each CRS release given (default: Debian's)."""
    from sentin8.waf import WafEngine, WafSettings

    backend = HTTPBackend("web")
    work = Path(tempfile.mkdtemp(prefix="sentin8-waf-bench-"))
    off = start_fleet(work / "off", backend.port, False, args.paranoia)
    fleets = [off]
    try:
        words = b"+".join([b"ordinary", b"form", b"text", b"with", b"some", b"words"] * 40)
        form_body = b"&".join(b"field%02d=%s" % (i, words) for i in range(16))[:16384]
        form = (
            b"POST /submit HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (HOST.encode(), len(form_body), form_body)
        )
        cpu_off, _ = cpu_per_request(off, form, args.cpu_requests)
        for i, crs_dir in enumerate(args.crs_dir or ["/usr/share/modsecurity-crs/rules"]):
            version = WafEngine(WafSettings(crs_dir=str(Path(crs_dir).resolve()))).crs_version
            fleet = start_fleet(work / f"crs{i}", backend.port, True, args.paranoia, crs_dir)
            fleets.append(fleet)
            print(f"CRS {version} ({crs_dir}), paranoia {args.paranoia}, through the proxy over PQ TLS")
            client = Client(fleet.port)
            own_corpus(client)
            client.close()
            cpu_on, _ = cpu_per_request(fleet, form, args.cpu_requests)
            print(f"16 KiB form POST: worker CPU {cpu_on:.0f} µs/request, WAF cost {cpu_on - cpu_off:.0f} µs\n")
    finally:
        for f in fleets:
            f.stop()
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
