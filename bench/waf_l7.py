"""L7 keep-alive with the WAF on: sentin8 beside nginx running the same engine and the same rules.

    sudo .venv/bin/python -m bench.waf_l7 [--duration 5] [--repeat 3] [--paranoia 1] [--conns 64] [--perf PREFIX]

Both peers terminate PQ TLS (X25519MLKEM768, ML-DSA-65) with 2 workers pinned to CPUs 0 and 1, in front of the
same backend nginx (a fixed 63-byte body), and inspect every request with **ModSecurity v3 and the OWASP CRS
the host has (3.3.4 on Debian 12, 4.x on 13; the report names it) at the same paranoia level and anomaly
threshold**: sentin8 with ``policy.waf`` (the engine of the
``libmodsecurity`` wheel, 3.0.15), nginx with Debian 13's ``libnginx-mod-http-modsecurity`` (libmodsecurity
3.0.14) loading the very rule files sentin8 loads (the host's ``modsecurity-crs``, copied into the run's work
directory, REQUEST-910 left out) and the same engine directives (``sentin8.waf``'s, written out). Each is also
measured with its WAF off, for the WAF's own cost. Load: ``h2load --h1`` keep-alive, a GET without body and a
16 KiB form POST (16 fields of ~1 KiB of words). Reported: requests/s and the peer's CPU per request (all of its
processes), medians of ``--repeat`` runs interleaved across peers, and sentin8 / nginx.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import certs, loadtools, procs, stack, toolchain
from bench.clients import Sample
from sentin8 import waf
from sentin8.config import Policy

FORM = b"&".join(
    b"field%02d=%s" % (i, b"+".join([b"ordinary", b"form", b"text", b"with", b"some", b"words"] * 40))
    for i in range(16)
)[:16384]


def rules_dir(work: Path, paranoia: int) -> tuple[Path, str]:
    """(the directory, the CRS release) of the rule files nginx loads: sentin8's whole rule set
    (``waf.rule_parts``: engine directives, the CRS set-up for the release found, the CRS files in sentin8's
    order), the files copied beside their ``.data`` files."""
    d = work / "modsec"
    crs = d / "crs"
    crs.mkdir(parents=True, exist_ok=True)
    settings = waf.settings_from_policy(Policy(waf=True, waf_paranoia=paranoia))
    conf = []
    layout = waf.crs_layout(settings.crs_dir)
    for part in waf.rule_parts(settings, layout, partial=False):
        if not part.path:
            conf.append(part.text)
            continue
        src = Path(part.path)
        for data in src.parent.glob("*.data"):
            if not (crs / data.name).exists():
                shutil.copy(data, crs / data.name)
        shutil.copy(src, crs / src.name)
        conf.append(f"Include {crs / src.name}\n")
    (d / "main.conf").write_text("".join(conf))
    return d, str(layout.version)


def start_nginx_waf(
    tc: toolchain.Toolchain, work: Path, cert: certs.CertFiles, backend_http: int, nofile: int, rules: Path | None
) -> stack.Peer:
    name = "nginx-waf" if rules else "nginx-nowaf"
    port = stack.free_port()
    conf = work / f"{name}.conf"
    modsec = (
        f"    modsecurity on;\n    modsecurity_rules_file {rules / 'main.conf'};\n    client_body_buffer_size 128k;\n"
        if rules
        else ""
    )
    conf.write_text(
        stack._nginx_common(work, name, stack.WORKERS, "01 10", nofile).replace(
            "load_module /usr/lib/nginx/modules/ngx_stream_module.so;",
            "load_module /usr/lib/nginx/modules/ngx_http_modsecurity_module.so;" if rules else "",
        )
        + f"""
http {{
{stack._http_common(work, name)}
{modsec}
    upstream backend {{ server 127.0.0.1:{backend_http}; keepalive 128; }}
    server {{
        listen 127.0.0.1:{port} ssl backlog=4096 reuseport;
{stack._tls_lines(cert)}
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""
    )
    log = work / f"{name}.log"
    proc = stack._popen(tc, ["nginx", "-c", str(conf)], log)
    stack.wait_port(port, timeout=30, proc=proc)
    return stack.Peer(name, l7_port=port, proc=proc, log=log)


def start_sentin8_waf(work: Path, cert: certs.CertFiles, backend_http: int, on: bool, paranoia: int) -> stack.Peer:
    from tests.peers import Fleet

    name = "sentin8-waf" if on else "sentin8-nowaf"
    d = work / name
    cdir = d / "certs" / "bench.test"
    cdir.mkdir(parents=True)
    shutil.copy(cert.cert, cdir / "fullchain.pem")
    shutil.copy(cert.key, cdir / "privkey.pem")
    body = (
        f'[[instances]]\nservice = "web"\nid = "web-1"\nhost = "127.0.0.1"\nport = {backend_http}\n'
        '[[domains]]\nhostname = "bench.test"\nservice = "web"\n'
    )
    extra = (
        f'[network]\ninternal_cidrs = ["10.0.0.0/8"]\n[policy]\nwaf = {str(on).lower()}\nwaf_paranoia = {paranoia}\n'
    )
    fleet = Fleet(str(d), body, workers=stack.WORKERS, extra=extra)
    return stack.Peer(name, l7_port=fleet.port, fleet=fleet)


def h2load(tc: toolchain.Toolchain, port: int, a: argparse.Namespace, body: Path | None) -> Sample:
    """GET: ``--conns`` connections for ``--duration``. POST: ``--posts`` requests over 8 connections (a 16 KiB
    form costs the engine tens of ms of CPU, so a timed run would mostly wait for the queue to drain)."""
    argv = ["h2load", "--h1", "--groups", loadtools.GROUPS, "-t2"]
    if body is None:
        argv += [f"-c{a.conns}", "-D", f"{a.duration:g}"]
    else:
        argv += ["-c8", "-n", str(a.posts), "-d", str(body), "-H", "Content-Type: application/x-www-form-urlencoded"]
    res = tc.run([*argv, f"https://bench.test:{port}/submit?id=42"], timeout=a.duration + 300)
    return loadtools._h2load_rate(res)


def _perf_record(out: str, pid: int) -> subprocess.Popen:
    """``perf record -g`` (cpu-clock, 999 Hz) on one worker until SIGINT: where the WAF's CPU goes."""
    argv = ["perf", "record", "-q", "-e", "cpu-clock", "-F", "999", "-g", "-o", out, "-p", str(pid)]
    proc = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
    time.sleep(0.3)  # attached before the load starts
    return proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--paranoia", type=int, default=1)
    ap.add_argument("--conns", type=int, default=64)
    ap.add_argument("--posts", type=int, default=200, help="16 KiB form POSTs per peer and repeat")
    ap.add_argument("--force-chroot", action="store_true")
    ap.add_argument("--perf", default="", help="perf record -g one worker of each WAF peer in the first GET run")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sentin8-waf-l7-"))
    tc = toolchain.ensure(work, log=sys.stderr, force_chroot=a.force_chroot)
    nofile = stack.rlimit_nofile()
    cert = certs.write_mldsa65(work / "cert", ["bench.test", "*.bench.test"])
    (work / "form.txt").write_bytes(FORM)
    rules, crs_release = rules_dir(work, a.paranoia)  # before any process starts: no CRS, nothing to leave running
    backend = stack.start_backend_nginx(tc, work, cert, nofile)
    peers: list[stack.Peer] = []
    try:
        peers = [
            start_sentin8_waf(work, cert, backend.extra["http"], True, a.paranoia),
            start_nginx_waf(tc, work, cert, backend.extra["http"], nofile, rules),
            start_sentin8_waf(work, cert, backend.extra["http"], False, a.paranoia),
            start_nginx_waf(tc, work, cert, backend.extra["http"], nofile, None),
        ]
        results: dict[tuple[str, str], list[tuple[float, float]]] = {}
        loads = {"GET": None, "16 KiB form POST": work / "form.txt"}
        for rep in range(a.repeat):
            order = peers[rep % len(peers) :] + peers[: rep % len(peers)]
            for load, body in loads.items():
                for peer in order:
                    pids = peer.pids()
                    rec = None
                    if a.perf and rep == 0 and body is None and peer.name.endswith("-waf"):
                        rec = _perf_record(f"{a.perf}-{peer.name}.data", peer.worker_pids()[0])
                    c0 = procs.cpu_seconds(pids)
                    s = h2load(tc, peer.l7_port, a, body)
                    cpu = procs.cpu_seconds(pids) - c0
                    if rec is not None:
                        rec.send_signal(signal.SIGINT)
                        rec.wait(60)
                    if s.value is None or s.errors:
                        print(f"bench: {peer.name} {load}: {s.error or ''} errors={s.errors}", file=sys.stderr)
                    if s.value is not None and s.count:
                        results.setdefault((peer.name, load), []).append((s.value, cpu / s.count * 1e6))
                        print(f"bench: {peer.name:14} {load:17} {s.value:9.0f} req/s", file=sys.stderr)
        print(
            f"\nL7 keep-alive, h2load --h1 (GET: -c{a.conns} for {a.duration:g} s; POST: -c8 -n {a.posts}) "
            f"x {a.repeat}, CRS {crs_release} paranoia {a.paranoia} (medians)\n"
        )
        print(f"{'peer':15} {'load':18} {'req/s':>9} {'CPU-µs/req':>11}")
        med: dict[tuple[str, str], tuple[float, float]] = {}
        for (name, load), vals in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            rate = statistics.median(v[0] for v in vals)
            cpu = statistics.median(v[1] for v in vals)
            med[(name, load)] = (rate, cpu)
            print(f"{name:15} {load:18} {rate:9.0f} {cpu:11.0f}")
        print()
        for load in loads:
            s8, ng = med.get(("sentin8-waf", load)), med.get(("nginx-waf", load))
            if s8 and ng:
                print(f"WAF on, {load}: sentin8 / nginx = {s8[0] / ng[0]:.2f} (req/s), {s8[1] / ng[1]:.2f} (CPU/req)")
            # the two peers of one repeat ran minutes apart at most, the repeats further: on a machine whose speed
            # drifts, the ratio within each repeat is the steadier figure
            ours, theirs = results.get(("sentin8-waf", load), []), results.get(("nginx-waf", load), [])
            if len(ours) == len(theirs) == a.repeat:
                rate = statistics.median(o[0] / t[0] for o, t in zip(ours, theirs, strict=True))
                cpu = statistics.median(o[1] / t[1] for o, t in zip(ours, theirs, strict=True))
                print(f"  within each repeat (median of {a.repeat}): {rate:.2f} (req/s), {cpu:.2f} (CPU/req)")
            off = med.get(("sentin8-nowaf", load))
            if s8 and off:
                print(f"sentin8 WAF cost, {load}: {s8[1] - off[1]:.0f} CPU-µs/req")
    finally:
        for p in [*peers, backend]:
            p.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
