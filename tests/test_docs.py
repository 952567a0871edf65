"""Docs that cannot drift: the generated references match the code, the example config loads as the defaults,
README keeps its two commands first, and every relative link in README and docs/ resolves."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sentin8 import data, docgen
from sentin8.config import Config, doc, load_bytes
from sentin8.metrics import prometheus
from sentin8.shm import counters
from sentin8.shm.state import SharedState
from tests.peers import REPO

# Pages other branches add, linked from docs/index.md before they land. The lead removes a name here when its
# page merges; the test then holds that link like any other.
EXPECTED_BY_MERGE: set[str] = set()  # pages linked before they land (none now)

README_COMMANDS = [
    "./dev demo    # set up, run the proxy on its embedded default (file sources, :8443, a demo TLS backend);"
    " prints how to reach it",
    "./dev test    # set up (virtualenv, packages, Debian packages for the real peers when missing), then pytest"
    " -n auto",
]


# ---- generated files --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [docgen.CONFIG_MD, docgen.METRICS_MD, docgen.EXAMPLE_TOML])
def test_a_generated_file_matches_the_code_it_documents(path):
    made = docgen.outputs(Path(counters.__file__).with_name("counters.py").read_text())[path]
    on_disk = (REPO / path).read_text() if (REPO / path).is_file() else ""
    assert on_disk == made, f"{path} is stale: regenerate with `./dev docs` (= `{docgen.REGENERATE}`) and commit it"


def test_the_check_mode_of_the_command_agrees():
    done = subprocess.run([sys.executable, "-m", "sentin8.docgen", "--check"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_every_key_and_section_is_in_the_reference():
    text = (REPO / docgen.CONFIG_MD).read_text()
    for section in docgen.sections():
        assert f"`[{section.name}]`" in text or f"`[[{section.name}]]`" in text
        for key in section.keys:
            assert f"| `{section.name}.{key.name}` |" in text
    names = {s.name for s in docgen.sections()}
    assert {"listen", "policy", "policy.waf_exclusions", "instances", "domains", "shm"} <= names


class _Sec(msgspec.Struct, kw_only=True):
    fine: Annotated[int, doc("documented")] = 1
    bare: int = 0


class _Root(msgspec.Struct, kw_only=True):
    sec: _Sec = msgspec.field(default_factory=_Sec)


def test_a_key_without_documentation_is_named():
    with pytest.raises(docgen.DocError, match=r"^sec\.bare: no documentation"):
        docgen.sections(_Root)


def test_every_counter_and_every_prometheus_family_is_in_the_metrics_reference():
    text = (REPO / docgen.METRICS_MD).read_text()
    for name in counters.NAMES:
        assert f"| `{name}`" in text
    for fam in prometheus.FAMILIES:
        assert f"| `{fam.exposed()}` |" in text


def test_counter_groups_read_headings_and_trailing_comments():
    source = """
NAMES: tuple[str, ...] = (
    # accept
    "a",  # the first
    "b",
    # refusals by kind, continued
    # on a second line
    "c",  # three (with "quotes" and a # inside)
)
OTHER = ("x",)  # not part of it
"""
    groups = docgen.counter_groups(source, ("a", "b", "c"))
    assert [(g.heading, g.names) for g in groups] == [
        ("accept", [("a", "the first"), ("b", "")]),
        ("refusals by kind, continued on a second line", [("c", 'three (with "quotes" and a # inside)')]),
    ]
    with pytest.raises(docgen.DocError, match="differ"):
        docgen.counter_groups(source, ("a", "b"))


def test_a_counter_without_a_comment_is_named():
    real = Path(counters.__file__).with_name("counters.py").read_text()
    stripped = re.sub(r'("accepted",)  # [^\n]*', r"\1", real)
    assert stripped != real
    with pytest.raises(docgen.DocError, match=r"^counter accepted: no comment in NAMES"):
        docgen.metrics_md(stripped)


def test_the_families_the_collector_yields_are_the_declared_ones(tmp_path):
    cfg = load_bytes(
        f'[shm]\nsnapshot_bytes = 65536\n[tls]\nstate_dir = "{tmp_path}"\ncert_dir = "{tmp_path}"\n'.encode()
    )
    body, _ = prometheus.exposition(SharedState(cfg, 2))
    exposed = {fam.name for fam in text_string_to_metric_families(body.decode())}
    assert exposed == {f.name for f in prometheus.FAMILIES}


# ---- the example config ----------------------------------------------------------------------------------------


def test_the_printed_example_loads_as_exactly_the_defaults():
    done = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "check-config", "--print-defaults"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == data.read_text(data.EXAMPLE_CONFIG) == (REPO / docgen.EXAMPLE_TOML).read_text()
    assert load_bytes(done.stdout.encode()) == Config()
    for section in docgen.sections():
        for key in section.keys:  # every key is in it, with its comment
            shown = (
                rf"^# \[\[{re.escape(section.name)}\.{key.name}\]\]$"
                if key.type == "array of tables"
                else (rf"^(# )?{re.escape(key.name)} = ")
            )
            assert re.search(shown, done.stdout, re.M), key.name
            assert key.doc[:40] in " ".join(done.stdout.replace("# ", "").split()), key.name


def test_the_commented_out_tables_of_the_example_are_valid_entries():
    text = data.read_text(data.EXAMPLE_CONFIG)
    lines, inside = [], False
    for line in text.splitlines():
        if line.startswith("# [["):
            inside = True
            line = line[2:]
        elif inside and re.match(r"# [a-z_]+ = ", line):
            line = line[2:]
        elif not line.startswith("#"):
            inside = False
        lines.append(line)
    cfg = load_bytes("\n".join(lines).encode())
    assert cfg.instances[0].id == "web-1" and cfg.domains[0].hostname == "shop.apps.example.com"
    assert cfg.policy.waf_exclusions[0].rule_ids == [942100, 920420]


def test_check_config_without_a_file_says_what_it_needs():
    done = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "check-config"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 2 and "FILE is required (or --print-defaults)" in done.stderr


# ---- README and the links ----------------------------------------------------------------------------------------


def test_readme_starts_with_the_two_commands_and_stays_short():
    text = (REPO / "README.md").read_text()
    fence = re.search(r"^```[a-z]*\n(.*?)^```", text, re.M | re.S)
    assert fence is not None
    assert fence.group(1).splitlines() == README_COMMANDS
    assert len(text.splitlines()) <= 200


def _links(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)  # no links inside code blocks
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_every_relative_link_in_readme_and_docs_resolves():
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]
    assert len(pages) > 5
    broken = []
    for page in pages:
        for target in _links(page):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            resolved = (page.parent / target.split("#", 1)[0]).resolve()
            rel = resolved.relative_to(REPO).as_posix() if resolved.is_relative_to(REPO) else str(resolved)
            if not resolved.exists() and rel not in EXPECTED_BY_MERGE:
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, broken


def test_the_index_links_every_page_of_the_guide():
    index = (REPO / "docs" / "index.md").read_text()
    for page in sorted((REPO / "docs").glob("*.md")):
        if page.name != "index.md":
            assert f"({page.name}" in index, f"docs/index.md does not link {page.name}"
    for expected in EXPECTED_BY_MERGE:
        assert f"({Path(expected).name})" in index
