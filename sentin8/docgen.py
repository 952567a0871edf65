"""Generated references: the configuration reference, the annotated example config and the metrics reference.

Each is a pure function of the code it documents, so it cannot drift from it:

- ``docs/configuration.md`` and ``sentin8/data/sentin8.example.toml`` from the typed config
  (``sentin8/config.py``: every section's docstring, every key's type, default and ``doc(...)``);
- ``docs/metrics.md`` from the counter table (``NAMES`` in ``sentin8/shm/counters.py``, its group comments and
  each name's trailing comment, read from the module's source) and the Prometheus families
  (``FAMILIES`` in ``sentin8/metrics/prometheus.py``).

``python -m sentin8.docgen`` (``./dev docs``) rewrites the three files; ``--check`` only says which are stale
(exit 1).
``tests/test_docs.py`` fails when a file differs from what this module makes, naming that command. A key
without ``doc(...)`` or a counter without a comment is a :class:`DocError` naming it: the reference never
lists something it cannot explain.
"""

from __future__ import annotations

import ast
import io
import json
import re
import sys
import textwrap
import tokenize
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import msgspec.inspect as mi

from . import config as cfgmod

REGENERATE = "python -m sentin8.docgen"
CONFIG_MD = "docs/configuration.md"
METRICS_MD = "docs/metrics.md"
EXAMPLE_TOML = "sentin8/data/sentin8.example.toml"
WIDTH = 116


class DocError(Exception):
    """Something the code declares that the references cannot explain (phrased ``what: reason``)."""


# ---- the typed config, walked ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    name: str  # dotted from its section: "https", "waf_exclusions"
    type: str  # as the reference shows it: "integer", '"file" | "valkey"', "list of strings"
    doc: str
    default: object  # msgspec.NODEFAULT when required
    example: object = None  # for a required key: what the example shows


@dataclass(frozen=True)
class Section:
    name: str  # "listen", or "instances" for an array of tables, "policy.waf_exclusions" for a nested one
    doc: str
    array: bool  # [[name]] rather than [name]
    keys: list[Key] = field(default_factory=list)


def _unwrap(t: object) -> tuple[object, dict]:
    if isinstance(t, mi.Metadata):
        return t.type, dict(t.extra_json_schema or {})
    return t, {}


def _type_name(t: object) -> str:
    if isinstance(t, mi.BoolType):
        return "boolean"
    if isinstance(t, mi.IntType):
        return "integer"
    if isinstance(t, mi.FloatType):
        return "float"
    if isinstance(t, mi.StrType):
        return "string"
    if isinstance(t, mi.LiteralType):
        return " | ".join(json.dumps(v) for v in t.values)
    if isinstance(t, mi.ListType):
        item, _ = _unwrap(t.item_type)
        if isinstance(item, mi.StructType):
            return "array of tables"
        return {"string": "list of strings", "integer": "list of integers"}.get(_type_name(item), "list")
    raise DocError(f"{t!r}: a config type the reference cannot name (add it to sentin8.docgen._type_name)")


def _default(f: mi.Field) -> object:
    if f.default is not msgspec.NODEFAULT:
        return f.default
    if f.default_factory is not msgspec.NODEFAULT:
        value = f.default_factory()
        return msgspec.to_builtins(value)
    return msgspec.NODEFAULT


def _doc(cls: type) -> str:
    return " ".join((cls.__doc__ or "").split()).replace("``", "`")


def sections(root: type = cfgmod.Config) -> list[Section]:
    """Every section of ``root`` (:class:`sentin8.config.Config`) in declaration order, nested arrays of tables
    after their parent; raises :class:`DocError` for a key without ``doc(...)``."""
    out: list[Section] = []

    def walk(name: str, struct: mi.StructType, array: bool) -> None:
        section = Section(name, _doc(struct.cls), array)
        out.append(section)
        nested: list[tuple[str, mi.StructType]] = []
        for f in struct.fields:
            t, meta = _unwrap(f.type)
            text = " ".join(str(meta.get("description", "")).split())
            if not text:
                raise DocError(f"{name}.{f.name}: no documentation (declare it as Annotated[type, doc('...')])")
            examples = meta.get("examples") or [None]
            section.keys.append(Key(f.name, _type_name(t), text, _default(f), examples[0]))
            if isinstance(t, mi.ListType) and isinstance(_unwrap(t.item_type)[0], mi.StructType):
                nested.append((f"{name}.{f.name}", _unwrap(t.item_type)[0]))
        for sub, st in nested:
            walk(sub, st, True)

    top = mi.type_info(root)
    assert isinstance(top, mi.StructType)
    for f in top.fields:
        t, _ = _unwrap(f.type)
        if isinstance(t, mi.StructType):
            walk(f.name, t, False)
        elif isinstance(t, mi.ListType) and isinstance(_unwrap(t.item_type)[0], mi.StructType):
            walk(f.name, _unwrap(t.item_type)[0], True)
        else:
            raise DocError(f"{f.name}: a top-level key outside any section")
    return out


def toml_value(value: object) -> str:
    """A default as TOML writes it (strings as basic strings: JSON's escapes are TOML's)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise DocError(f"{value!r}: a default the example cannot write")


# ---- the annotated example config -----------------------------------------------------------------------------


def _comment(text: str, indent: str = "") -> list[str]:
    return textwrap.wrap(text, WIDTH - 2 - len(indent), initial_indent=f"{indent}# ", subsequent_indent=f"{indent}# ")


def example_toml() -> str:
    """Every key at its default, each under its comment; arrays of tables (empty by default) commented out with
    an example entry, so the file loads as exactly the defaults."""
    lines = [
        "# Sentin8:Proxy configuration: every key, at its default, with what it does.",
        f"# Generated from sentin8/config.py by `{REGENERATE}`; `sentin8-proxy check-config --print-defaults` prints",
        "# it. Copy it to /etc/sentin8-proxy/proxy.toml and change what your site needs: a key left out keeps the",
        "# default shown here. Reference: docs/configuration.md.",
    ]
    for sec in sections():
        lines.append("")
        lines += _comment(sec.doc)
        lines.append(f"# [[{sec.name}]]" if sec.array else f"[{sec.name}]")
        for key in sec.keys:
            if key.type == "array of tables":
                lines += _comment(f"{key.name}: {key.doc} (below)")
                continue
            value = key.default if key.default is not msgspec.NODEFAULT else key.example
            if value is None:
                raise DocError(f"{sec.name}.{key.name}: a required key needs doc(..., example)")
            if sec.array:  # commented out: the key and its comment on one line, told apart from each other
                lines.append(f"# {key.name} = {toml_value(value)}  # {key.doc}")
            else:
                lines += _comment(key.doc)
                lines.append(f"{key.name} = {toml_value(value)}")
    return "\n".join(lines) + "\n"


# ---- the configuration reference ------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def configuration_md() -> str:
    out = [
        "# Configuration reference",
        "",
        f"<!-- generated from sentin8/config.py by `{REGENERATE}`: edit the doc(...) there, not this file -->",
        "",
        "One TOML file (`/etc/sentin8-proxy/proxy.toml` under the unit), decoded into typed structs. Unknown keys,",
        "wrong types, bad addresses or CIDRs are one line naming the key and the reason (`listen.https: …`) and",
        "exit 2 before anything binds; `sentin8-proxy check-config FILE` checks a file (and the files and URLs",
        "it names) and prints the effective config; `sentin8-proxy check-config --print-defaults` prints the",
        "annotated example below as a file to start from. Every key is optional: the default applies.",
        "A reload (SIGHUP, `systemctl reload`) applies a changed file; `[shm]` sizes, `tls.ticket_key_rotation_s`",
        "and a changed `listen.mgmt` apply at the next start ([upgrades and reloads](upgrades.md)).",
        "",
    ]
    for sec in sections():
        out.append(f"## `[[{sec.name}]]`" if sec.array else f"## `[{sec.name}]`")
        out.append("")
        if sec.doc:
            out += [sec.doc, ""]
        out += ["| key | type | default | what it does |", "|---|---|---|---|"]
        for key in sec.keys:
            if key.default is msgspec.NODEFAULT:
                default = "required"
            elif key.type == "array of tables":
                default = "none"
            else:
                default = f"`{_cell(toml_value(key.default))}`"
            out.append(f"| `{sec.name}.{key.name}` | {_cell(key.type)} | {default} | {_cell(key.doc)} |")
        out.append("")
    out += ["## The annotated example", "", "```toml", example_toml().rstrip("\n"), "```", ""]
    return "\n".join(out)


# ---- the metrics reference ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CounterGroup:
    heading: str
    names: list[tuple[str, str]]  # (name, comment)


def counter_groups(
    source: str, names: tuple[str, ...], spliced: Mapping[str, object] | None = None
) -> list[CounterGroup]:
    """``NAMES`` as its source declares it: a comment line starts a group, a name's trailing comment explains it.

    ``source`` is sentin8/shm/counters.py's text; the names read from it must be ``names``, in order, or the
    source is not the module that is running (:class:`DocError`). ``*TABLE`` entries (another module's names
    spliced in, e.g. the h2 refusal reasons) are looked up in ``spliced`` (the module's globals); each name
    takes the entry's trailing comment."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    start = next(
        (i for i, t in enumerate(tokens) if t.type == tokenize.NAME and t.string == "NAMES" and t.start[1] == 0),
        None,
    )
    if start is None:
        raise DocError("sentin8/shm/counters.py: no NAMES table")
    i = next(j for j in range(start, len(tokens)) if tokens[j].string == "(")
    groups: list[CounterGroup] = [CounterGroup("", [])]
    depth, pending, star = 0, None, False
    for t in tokens[i:]:
        if t.type == tokenize.OP and t.string == "*":
            star = True
        elif star and t.type == tokenize.NAME:
            star = False
            table = (spliced or {}).get(t.string)
            if not isinstance(table, tuple):
                raise DocError(f"sentin8/shm/counters.py: *{t.string} in NAMES is not a table of names")
            groups[-1].names.extend((name, "") for name in table)
            pending = (t.start[0], len(table))
        elif t.string == "(":
            depth += 1
        elif t.string == ")":
            depth -= 1
            if depth == 0:
                break
        elif t.type == tokenize.STRING:
            pending = (t.start[0], 1)
            groups[-1].names.append((ast.literal_eval(t.string), ""))
        elif t.type == tokenize.COMMENT:
            text = t.string.lstrip("#").strip()
            if pending is not None and t.start[0] == pending[0]:  # trailing: explains the entry's name(s)
                entry = groups[-1].names
                entry[len(entry) - pending[1] :] = [(name, text) for name, _ in entry[len(entry) - pending[1] :]]
            elif groups[-1].names:  # a comment line after names: the next group's heading
                groups.append(CounterGroup(text, []))
            else:  # the first heading, or one continued on the next line
                groups[-1] = CounterGroup(f"{groups[-1].heading} {text}".strip(), [])
    read = tuple(n for g in groups for n, _ in g.names)
    if read != names:
        raise DocError("sentin8/shm/counters.py: the NAMES read from the source differ from the module's")
    return [g for g in groups if g.names]


def metrics_md(counters_source: str) -> str:
    from .metrics import prometheus
    from .metrics.scales import STATUS_LABELS
    from .shm import counters as c

    label_values = {
        ("sentin8_requests", "status"): "each registered code, else `1xx` … `5xx` or `other`",
        ("sentin8_upstream_connections", "kind"): " \\| ".join(c.UPSTREAM_KINDS),
        ("sentin8_connections", "side"): "external \\| internal",
        ("sentin8_handshake_errors", "reason"): " \\| ".join(c.HANDSHAKE_REASONS),
        ("sentin8_policy_blocks", "kind"): " \\| ".join(c.POLICY_KINDS),
        ("sentin8_events", "name"): "every counter below that is not a gauge",
        ("sentin8_certificate_expiry_seconds", "source"): "store \\| bootstrap",
        ("sentin8_worker_rss_bytes", "worker"): "index; a draining predecessor counts with its successor",
    }
    assert len(STATUS_LABELS) > 0
    gauge_help = {f.name.removeprefix("sentin8_"): f.help for f in prometheus.FAMILIES if f.kind == "gauge"}
    out = [
        "# Metrics reference",
        "",
        f"<!-- generated from sentin8/shm/counters.py and sentin8/metrics/prometheus.py by `{REGENERATE}` -->",
        "",
        "What each metric means; how to collect them (Prometheus, `stat:metrics`, logs) is in",
        "[observability](observability.md). Counts, statuses and timings only: no path, query, header value or",
        "payload byte ever reaches a metric.",
        "",
        "## Prometheus (`GET /metrics` on `listen.mgmt`)",
        "",
        "Cumulative since the fleet started (a worker that dies or is replaced is folded in, never lost).",
        "",
        "| metric | type | labels | what it counts |",
        "|---|---|---|---|",
    ]
    for fam in prometheus.FAMILIES:
        labels = []
        for label in fam.labels:
            values = label_values.get((fam.name, label))
            labels.append(f"`{label}` ({values})" if values else f"`{label}`")
        if fam.kind == "histogram":
            labels.append("`le` (18 log-spaced buckets, 250 µs … 60 s, +Inf)")
        out.append(f"| `{fam.exposed()}` | {fam.kind} | {', '.join(labels) or '—'} | {_cell(fam.help)} |")
    out += [
        "",
        "## Fleet counters (`sentin8_events_total{name=…}`, `GET /stats`, `SIGUSR1`)",
        "",
        "Every worker counts into its own block of shared memory; readers sum the blocks. Gauges (marked) belong to",
        "the live processes and are not in `sentin8_events_total`: they have their own Prometheus gauge.",
        "",
    ]
    for group in counter_groups(counters_source, c.NAMES, vars(c)):
        if group.heading:  # its first clause: the rest of a group comment speaks to whoever edits the table
            title = re.split(r" \(|[:;.]", group.heading, maxsplit=1)[0]
            out += [f"### {title[0].upper()}{title[1:]}", ""]
        out += ["| counter | what it counts |", "|---|---|"]
        for name, text in group.names:
            if not text and name in gauge_help:
                text = gauge_help[name]
            if not text:
                raise DocError(f"counter {name}: no comment in NAMES (sentin8/shm/counters.py): add one on its line")
            mark = " (gauge)" if name in c.GAUGES else ""
            out.append(f"| `{name}`{mark} | {_cell(text)} |")
        out.append("")
    return "\n".join(out)


# ---- all of it ------------------------------------------------------------------------------------------------


def outputs(counters_source: str) -> dict[str, str]:
    """Path (from the repository root) -> the text it must hold."""
    return {CONFIG_MD: configuration_md(), METRICS_MD: metrics_md(counters_source), EXAMPLE_TOML: example_toml()}


def main(argv: list[str] | None = None) -> int:
    """The I/O shell: read counters.py, write (or ``--check``) the files under the repository root."""
    args = sys.argv[1:] if argv is None else argv
    root = Path(__file__).resolve().parent.parent
    if not (root / "pyproject.toml").is_file():
        print(f"{root}: not a checkout of the project (the files it writes live in one)", file=sys.stderr)
        return 2
    from .shm import counters

    made = outputs(Path(counters.__file__).with_name("counters.py").read_text())
    stale = [p for p, text in made.items() if not (root / p).is_file() or (root / p).read_text() != text]
    if "--check" in args:
        for p in stale:
            print(f"{p}: stale (regenerate: {REGENERATE})", file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        (root / p).parent.mkdir(parents=True, exist_ok=True)
        (root / p).write_text(made[p])
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
