"""Turn the run's samples into ``bench/results/<date>.md`` (+ .json) and a PNG chart."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.clients import Sample

PEERS = ("sentin8", "nginx", "haproxy", "haproxy-splice", "direct")
RATIO_AGAINST = ("nginx", "haproxy", "direct")
PYLIB = Path(os.environ.get("SENTIN8_BENCH_CACHE", "/var/cache/sentin8-bench")) / "pylib"


@dataclass
class Scenario:
    key: str
    title: str
    unit: str  # of the value
    higher_better: bool
    cpu_unit: str = ""  # "" = no CPU column (memory)
    cpu_scale: float = 1.0  # cpu_seconds / count * cpu_scale -> cpu_unit
    peers: tuple[str, ...] = PEERS
    how: str = ""  # one line for the notes
    seconds: float = 0.0  # wall time the scenario took in this run


@dataclass
class Cell:
    samples: list[Sample] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # per-unit CPU of each good sample
    skipped: str = ""  # why the cell was not measured at all
    notes: set[str] = field(default_factory=set)  # what the errors were, when a sample still has a value

    def good(self) -> list[Sample]:
        return [s for s in self.samples if s.value is not None]

    @property
    def value(self) -> float | None:
        good = self.good()
        return statistics.median(s.value for s in good) if good else None

    def median_detail(self, key: str) -> float | None:
        vals = [s.detail[key] for s in self.good() if key in s.detail]
        return statistics.median(vals) if vals else None

    @property
    def errors(self) -> int:
        return sum(s.errors for s in self.samples)

    @property
    def failures(self) -> list[str]:
        out = {s.error for s in self.samples if s.value is None and s.error} | self.notes
        return ([self.skipped] if self.skipped else []) + sorted(out)


def _fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def cell_text(sc: Scenario, cell: Cell | None) -> str:
    if cell is None:
        return "—"
    v = cell.value
    if v is None:
        return "n/a"
    if sc.key.startswith("latency"):
        text = f"{_fmt(cell.median_detail('p50_ms'))} / **{_fmt(v)}** / {_fmt(cell.median_detail('p999_ms'))}"
    elif sc.key.startswith("ws"):
        text = f"**{_fmt(v)}** (p99 {_fmt(cell.median_detail('p99_us'))})"
    elif sc.key.startswith("mem"):
        text = f"**{_fmt(v)}** ({_fmt(cell.median_detail('idle_mib'))} → {_fmt(cell.median_detail('loaded_mib'))} MiB)"
    else:
        text = f"**{_fmt(v)}**"
    if sc.cpu_unit and cell.cpu:
        text += f" · {_fmt(statistics.median(cell.cpu))}"
    if cell.errors:
        text += f" ⚠{cell.errors} err"
    return text


def ratio(sc: Scenario, a: Cell | None, b: Cell | None) -> str:
    if a is None or b is None or a.value is None or b.value is None or b.value == 0:
        return "—"
    return f"{a.value / b.value:.2f}"


def markdown(meta: dict, scenarios: list[Scenario], cells: dict[tuple[str, str], Cell], chart: str | None) -> str:
    lines = [f"# Sentin8:Proxy side-by-side bench — {meta['date']}", ""]
    if meta.get("warning"):
        lines += [f"> **{meta['warning']}**", ""]
    lines += ["## Run", ""]
    for k, v in meta["run"].items():
        lines.append(f"- **{k}**: {v}")
    lines += ["", "## Results", ""]
    lines.append(
        "Median of the repeats. Each cell: **value** · CPU per unit (all processes of that peer, utime+stime from "
        "/proc; for *direct* the backend's own). ↑ higher is better, ↓ lower is better. Ratios are sentin8's value "
        "over the peer's (for ↓ rows, below 1 means sentin8 is better). n/a = the cell failed (see Failures); "
        "— = not applicable."
    )
    lines.append("")
    head = ["scenario", "unit · CPU unit", *PEERS, *(f"sentin8/{p}" for p in RATIO_AGAINST)]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for sc in scenarios:
        arrow = "↑" if sc.higher_better else "↓"
        row = [f"{sc.title} {arrow}", sc.unit + (f" · {sc.cpu_unit}" if sc.cpu_unit else "")]
        row += [cell_text(sc, cells.get((sc.key, p))) for p in PEERS]
        row += [ratio(sc, cells.get((sc.key, "sentin8")), cells.get((sc.key, p))) for p in RATIO_AGAINST]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    if chart:
        lines += [f"![relative to nginx]({chart})", ""]
    errs = [
        (sc, p, c)
        for sc in scenarios
        for p in PEERS
        if (c := cells.get((sc.key, p))) is not None and (c.errors or c.failures)
    ]
    lines += ["## Errors and failures", ""]
    if not errs:
        lines += ["None: no socket errors, no non-2xx responses, no failed cell.", ""]
    else:
        lines.append("| scenario | peer | errors (socket + non-2xx, all repeats) | why a repeat or the cell failed |")
        lines.append("|---|---|---|---|")
        for sc, p, c in errs:
            why = "; ".join(c.failures).replace("|", "/") or "—"
            lines.append(f"| {sc.title} | {p} | {c.errors} | {why} |")
        lines.append("")
    lines += ["## What each scenario does", ""]
    for sc in scenarios:
        lines.append(f"- **{sc.title}** ({sc.seconds:.0f} s in this run): {sc.how}")
    lines.append("")
    for title, items in meta.get("sections", {}).items():
        lines += [f"## {title}", ""] + [f"- {x}" for x in items] + [""]
    return "\n".join(lines)


def write_json(path: Path, meta: dict, cells: dict[tuple[str, str], Cell]) -> None:
    out = {
        "meta": meta,
        "cells": {
            f"{k[0]}|{k[1]}": {
                "samples": [asdict(s) for s in c.samples],
                "cpu": c.cpu,
                "skipped": c.skipped,
                "notes": sorted(c.notes),
            }
            for k, c in cells.items()
        },
    }
    path.write_text(json.dumps(out, indent=1, default=str))


# ---- chart ------------------------------------------------------------------------------------------------

_CHART = r"""
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
data = json.load(open(sys.argv[1]))
rows, peers, colors = data["rows"], data["peers"], data["colors"]
vals = [v for r in rows for v in r["rel"].values() if v and v > 0]
lo, hi = max(0.02, min(vals + [1.0]) / 1.6), min(50.0, max(vals + [1.0]) * 1.6)
fig, ax = plt.subplots(figsize=(11, 0.62 * len(rows) + 1.6))
h = 0.8 / len(peers)
labelled = set()
for j, peer in enumerate(peers):
    for i, r in enumerate(rows):
        y = i + (j - (len(peers) - 1) / 2) * h
        v = r["rel"].get(peer)
        if v is not None and v > 0:
            v = min(max(v, lo), hi)
            # a bar from 1 (= nginx) to the value: right of the line is better than nginx, left is worse
            ax.barh(y, v - 1.0, left=1.0, height=h * 0.92, color=colors[j],
                    label=None if peer in labelled else peer)
            labelled.add(peer)
            ax.text(v * (1.03 if v >= 1 else 0.97), y, f"{r['rel'][peer]:.2f}", va="center",
                    ha="left" if v >= 1 else "right", fontsize=6)
        elif peer in r["applies"]:
            ax.text(1.03, y, f"{peer}: n/a", va="center", fontsize=6, color=colors[j])
ax.axvline(1.0, color="black", lw=0.8)
ax.set_xscale("log")
ax.set_xlim(lo, hi)
from matplotlib.ticker import FuncFormatter, LogLocator
ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
ax.set_yticks(range(len(rows)))
ax.set_yticklabels([r["title"] for r in rows], fontsize=8)
ax.invert_yaxis()
ax.set_xlabel("relative to nginx (= 1), log scale; right of the line is better than nginx for every metric")
ax.set_title(data["title"], fontsize=10)
ax.legend(fontsize=8, loc="best")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
"""


def _matplotlib_env(log) -> dict | None:
    """matplotlib is not a project dependency: install it once into a cache dir outside the venv and repo."""
    env = {**os.environ, "PYTHONPATH": str(PYLIB)}
    probe = [sys.executable, "-c", "import matplotlib"]
    if subprocess.run(probe, env=env, capture_output=True).returncode == 0:
        return env
    print(f"bench: installing matplotlib into {PYLIB} for the chart", file=log, flush=True)
    res = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(PYLIB), "matplotlib"],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0 or subprocess.run(probe, env=env, capture_output=True).returncode != 0:
        print(f"bench: no chart (matplotlib install failed: {res.stderr.strip()[-200:]})", file=log, flush=True)
        return None
    return env


def chart(png: Path, scenarios: list[Scenario], cells: dict[tuple[str, str], Cell], title: str, log) -> bool:
    rows = []
    for sc in scenarios:
        base = cells.get((sc.key, "nginx"))
        if base is None or base.value is None:
            continue
        rel = {}
        for p in PEERS:
            c = cells.get((sc.key, p))
            if c is not None and c.value:
                rel[p] = c.value / base.value if sc.higher_better else base.value / c.value
        rows.append({"title": sc.title, "rel": rel, "applies": [p for p in PEERS if (sc.key, p) in cells]})
    if not rows:
        return False
    env = _matplotlib_env(log)
    if env is None:
        return False
    spec = png.with_suffix(".chart.json")
    colors = ["#d62728", "#2ca02c", "#1f77b4", "#17becf", "#7f7f7f"]
    spec.write_text(json.dumps({"rows": rows, "peers": list(PEERS), "colors": colors, "title": title}))
    try:
        res = subprocess.run(
            [sys.executable, "-c", _CHART, str(spec), str(png)], env=env, capture_output=True, text=True
        )
    finally:
        spec.unlink(missing_ok=True)
    if res.returncode != 0:
        print(f"bench: chart failed: {res.stderr.strip()[-300:]}", file=log, flush=True)
        return False
    return True
