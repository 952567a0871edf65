"""The wheel, built once and installed into a clean virtualenv: what an install from it alone has.

``pip wheel --no-deps`` of a clean copy of the tree (no build/, no compiled modules; the build backend,
pyproject's setuptools, comes from where ``./dev``'s editable install got it), then installed with ``--no-deps`` into a fresh venv whose dependencies come from the test environment's site-packages through a
``.pth`` line: a ``.pth`` line only extends ``sys.path``, so the editable install of this checkout (a finder
that ``site`` would load from that directory's own ``.pth`` files) is not seen, and every ``sentin8`` module
the venv imports comes from the wheel. Checked there: the package data is inside (the dashboard, the example
config, the unit files as plain files, the grants the SQL file is generated from) and ``sentin8-proxy
check-config --print-defaults`` runs from the installed entry point.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from sentin8 import docgen
from tests.peers import REPO

NOT_SHIPPED = shutil.ignore_patterns(
    ".git",
    ".venv",
    "__pycache__",
    "build",
    "dist",
    "*.egg-info",
    "*.so",
    "native.stamp",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
    "results",
)

pytestmark = pytest.mark.timeout(300)

PROBE = """
import importlib.resources as r, json, sys
import sentin8, sentin8.data
out = {
    "sentin8": sentin8.__file__,
    "dashboard": r.files("sentin8.mgmt").joinpath("dashboard.html").read_text(),
    "example": sentin8.data.read_text(sentin8.data.EXAMPLE_CONFIG),
    "systemd": {n: sentin8.data.read_text(n) for n in sentin8.data.SYSTEMD_FILES},
}
json.dump(out, sys.stdout)
"""


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, **kw)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def test_the_wheel_installed_in_a_clean_venv_has_its_package_data_and_runs(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=NOT_SHIPPED)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        env=env,
    )
    wheels = sorted((tmp_path / "dist").glob("sentin8_proxy-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as zf:
        names = set(zf.namelist())
        for member in (
            "sentin8/mgmt/dashboard.html",
            "sentin8/data/sentin8.example.toml",
            "sentin8/data/systemd/sentin8-proxy.service",
            "sentin8/data/systemd/99-sentin8-proxy.conf",
        ):
            assert member in names, f"{member} is not in the wheel"
            assert zf.getinfo(member).external_attr >> 28 != 0o12, f"{member} is a symlink in the wheel"
        assert not [n for n in names if n.startswith("tests/") or n.endswith(".so")]

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # the dependencies, not sentin8
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(wheels[0])], env=env)

    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SENTIN8_MYPYC")}
    got = json.loads(_run([str(py), "-c", PROBE], cwd=tmp_path, env=clean).stdout)
    assert Path(got["sentin8"]).is_relative_to(venv), f"sentin8 came from {got['sentin8']}, not the wheel"
    assert got["dashboard"] == (REPO / "sentin8/mgmt/dashboard.html").read_text()
    assert got["example"] == (REPO / docgen.EXAMPLE_TOML).read_text()
    for name, text in got["systemd"].items():
        assert text == (REPO / "systemd" / Path(name).name).read_text(), name
    grants = _run([str(py), "-m", "sentin8.sources.grants"], cwd=tmp_path, env=clean).stdout
    assert grants == (REPO / "sql" / "grants.sql").read_text()

    printed = _run([str(venv / "bin" / "sentin8-proxy"), "check-config", "--print-defaults"], cwd=tmp_path, env=clean)
    assert printed.stdout == got["example"]
    (tmp_path / "proxy.toml").write_text(
        printed.stdout.replace('state_dir = "/var/lib/sentin8-proxy"', f'state_dir = "{tmp_path / "state"}"')
    )
    checked = _run(
        [str(venv / "bin" / "sentin8-proxy"), "check-config", str(tmp_path / "proxy.toml")], cwd=tmp_path, env=clean
    )
    assert json.loads(checked.stdout)["listen"]["https"] == "0.0.0.0:443"
