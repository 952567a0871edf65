"""``sentin8-proxy --version``: the package version, the git revision and the build the hot path runs as, from a
checkout and from a (pure) wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from importlib import metadata

import sentin8
from tests.peers import REPO


def _head() -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_version_from_the_checkout_names_head():
    out = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "--version"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert line.startswith(f"sentin8-proxy {metadata.version('sentin8-proxy')} (revision {_head()}")
    assert line.endswith(f", {sentin8.BUILD})") and "unknown" not in line


def test_a_wheel_records_the_revision_and_answers_without_git(tmp_path):
    """Built like CI builds it (pip wheel), installed away from the checkout: no .git beside it. A pure wheel
    (``SENTIN8_PURE=1``: seconds, not the compiled one's minutes, which ``test_wheel`` builds): any platform's,
    and its ``--version`` says pure."""
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(REPO), "-w", str(wheels)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "SENTIN8_PURE": "1"},
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = wheels.glob("sentin8_proxy-*-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as zf:
        recorded = zf.read("sentin8/_revision.txt").decode().strip()
    assert recorded.startswith(_head())
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    # the installed copy first on the path (before the editable checkout), run from outside the checkout
    code = f"import sys; sys.path.insert(0, {str(site)!r}); sys.argv = ['sentin8-proxy', '--version']; " \
           "import sentin8, supervisor.cli; assert sentin8.__file__.startswith(sys.path[0]), sentin8.__file__; " \
           "supervisor.cli.main()"  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SENTIN8_PURE")}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"sentin8-proxy {metadata.version('sentin8-proxy')} (revision {recorded}, pure)"
