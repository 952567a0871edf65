"""The WAF engine's cost for one 16 KiB form POST, in-process, with the system's JIT PCRE2 and with the bundled one.

    .venv/bin/python -m bench.waf_pcre [--iterations 60] [--crs-dir /usr/share/modsecurity-crs/rules]

Each variant runs in a fresh process (which PCRE2 the engine binds to is decided once, when the engine library
is loaded: ``sentin8.pcre``): it builds a ``WafEngine`` with the CRS at paranoia 1 and inspects the same
request (the 16 KiB form body of ``bench.waf_corpus``, a GET for comparison) ``--iterations`` times; medians of
the thread's CPU time per inspection. Every verdict must be "allowed" (a benign body), so both variants do the
same work.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def _request(body: bytes) -> object:  # sentin8.waf is imported only after the PCRE2 choice
    from sentin8.waf import WafRequest

    headers = [(b"Host", b"shop.bench.test"), (b"User-Agent", b"bench"), (b"Accept", b"*/*")]
    if body:
        headers += [(b"Content-Type", b"application/x-www-form-urlencoded"), (b"Content-Length", b"%d" % len(body))]
    method = b"POST" if body else b"GET"
    return WafRequest(method, b"/search?page=2", "1.1", headers, "shop.bench.test", "203.0.113.7", body=body)


def child(system: bool, iterations: int, crs_dir: str) -> dict[str, object]:
    from sentin8 import pcre

    used = pcre.preload(system=system)
    from sentin8.waf import WafEngine, WafSettings

    engine = WafEngine(WafSettings(crs_dir=crs_dir))
    words = b"+".join([b"ordinary", b"form", b"text", b"with", b"some", b"words"] * 40)
    form = b"&".join(b"field%02d=%s" % (i, words) for i in range(16))[:16384]
    out: dict[str, object] = {"pcre": used.describe()}
    for name, req in (("get", _request(b"")), ("post_16k_form", _request(form))):
        engine.inspect(req)  # warm-up
        cpu = []
        for _ in range(iterations):
            t0 = time.thread_time_ns()
            verdict = engine.inspect(req)
            cpu.append(time.thread_time_ns() - t0)
            assert not verdict.blocked, verdict
        out[name + "_cpu_ms"] = statistics.median(cpu) / 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--crs-dir", default="/usr/share/modsecurity-crs/rules")
    ap.add_argument("--child", choices=("system", "bundled"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child == "system", args.iterations, args.crs_dir)))
        return
    results = {}
    for variant in ("bundled", "system"):
        cmd = [sys.executable, "-m", "bench.waf_pcre", "--child", variant, "--iterations", str(args.iterations)]
        run = subprocess.run([*cmd, "--crs-dir", args.crs_dir], capture_output=True, text=True, check=True)
        results[variant] = r = json.loads(run.stdout.strip().splitlines()[-1])
        print(
            f"{variant:8} GET {r['get_cpu_ms']:.2f} ms, 16 KiB form POST {r['post_16k_form_cpu_ms']:.2f} ms CPU"
            f"  [{r['pcre']}]"
        )
    b, s = results["bundled"], results["system"]
    print(f"POST: {b['post_16k_form_cpu_ms'] / s['post_16k_form_cpu_ms']:.2f}x faster with the system's PCRE2")


if __name__ == "__main__":
    main()
