"""Which PCRE2 the WAF engine matches with (``sentin8.pcre``): the system's JIT-capable copy when installed, the
wheel's bundled one otherwise, the choice said in a log line, and the same verdicts either way.

Each variant needs its own process (the engine's PCRE2 calls bind once, when its library is loaded), so the
verdicts are taken in child interpreters and compared.
"""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sentin8 import pcre
from sentin8.waf import WafEngine, WafSettings
from tests.crs_dirs import CRS_V3_RULES

REPO = Path(__file__).resolve().parent.parent
HAVE_SYSTEM_PCRE2 = ctypes.util.find_library("pcre2-8") is not None

CHILD = """
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
from sentin8 import pcre
mode = sys.argv[1]
used = pcre.preload("/nonexistent/libpcre2-8.so.0") if mode == "missing" else pcre.preload(system=mode == "system")
from sentin8.waf import WafEngine, WafSettings
from tests.test_waf import ATTACKS, BENIGN
engine = WafEngine(WafSettings(crs_dir=sys.argv[2]))
verdicts = {n: [v.blocked, sorted(v.rule_ids)] for n, r in {**ATTACKS, **BENIGN}.items() for v in [engine.inspect(r)]}
print(json.dumps({"source": used.source, "jit": used.jit, "verdicts": verdicts}))
"""


def run_child(mode: str) -> tuple[dict, str]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, CRS_V3_RULES], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.skipif(not HAVE_SYSTEM_PCRE2, reason="no system libpcre2-8 (Debian: libpcre2-8-0)")
def test_the_engine_uses_the_systems_jit_pcre2_and_says_so() -> None:
    WafEngine(WafSettings(crs_dir=CRS_V3_RULES))  # loads the engine library (once per process)
    used = pcre.in_use()
    assert used is not None and used.source == "system" and used.jit, used
    result, log = run_child("system")
    assert result["source"] == "system" and result["jit"]
    assert "WAF: PCRE2 in use: system libpcre2-8" in log and "JIT on" in log


@pytest.mark.skipif(not HAVE_SYSTEM_PCRE2, reason="no system libpcre2-8 (Debian: libpcre2-8-0)")
def test_verdicts_are_the_same_with_and_without_jit() -> None:
    jit, _ = run_child("system")
    bundled, _ = run_child("bundled")
    assert bundled["source"] == "bundled"
    assert jit["verdicts"] == bundled["verdicts"]  # same blocks, same rule ids
    assert any(blocked for blocked, _ids in jit["verdicts"].values())
    assert not all(blocked for blocked, _ids in jit["verdicts"].values())


def test_without_a_system_pcre2_the_bundled_one_is_used_and_logged() -> None:
    result, log = run_child("missing")
    assert result["source"] == "bundled"
    assert "WARNING WAF: PCRE2 in use: the wheel's bundled PCRE2 (no JIT)" in log
    assert result["verdicts"]["query-sqli"][0] and not result["verdicts"]["get"][0]  # the WAF still works
