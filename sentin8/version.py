"""What build is running: the package version and the source revision it was built from.

The version is the installed distribution's metadata (``pyproject.toml``). The revision has two sources, in
this order:

1. a git checkout: when the package is imported from a work tree (``pip install -e .``, ``python -m``), the
   work tree's ``HEAD`` says exactly what runs, with ``-dirty`` when tracked files differ from it;
2. ``sentin8/_revision.txt``, written into the build tree when a wheel is built (``setup.py``'s ``build_py``):
   an installed wheel has no ``.git`` beside it and must still answer.

Neither: ``unknown`` (an sdist built outside git, a copied tree). Read lazily and at most once per process:
``--version`` pays for one ``git`` call, nothing else does.
"""

from __future__ import annotations

import functools
import os
import subprocess
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "sentin8-proxy"
REVISION_FILE = "_revision.txt"
UNKNOWN = "unknown"
_PACKAGE = Path(__file__).resolve().parent


def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


def git_revision(tree: Path) -> str | None:
    """``HEAD`` of the git work tree holding ``tree`` (short hash, ``-dirty`` if tracked files changed), or
    None when ``tree`` is not in a work tree or git is missing."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}  # reading status must not take the index lock
    try:
        rev = subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, timeout=5, env=env, check=False,
        )  # fmt: skip
        if rev.returncode != 0 or not rev.stdout.strip():
            return None
        dirty = subprocess.run(
            ["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5, env=env, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return rev.stdout.strip() + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def _checkout_root() -> Path | None:
    """The source tree this package is imported from, if it is a git checkout (not a site-packages copy)."""
    root = _PACKAGE.parent
    return root if (root / ".git").exists() and (root / "pyproject.toml").is_file() else None


@functools.cache
def revision() -> str:
    root = _checkout_root()
    if root is not None:
        rev = git_revision(root)
        if rev:
            return rev
    try:
        recorded = (_PACKAGE / REVISION_FILE).read_text().strip()
    except OSError:
        recorded = ""
    return recorded or UNKNOWN


def describe(build: str) -> str:
    """The ``--version`` line: ``sentin8-proxy 0.1.0 (revision 0123abcd4567, compiled)``; ``build`` is what the
    hot path runs as (``sentin8.BUILD``: "compiled" or "pure")."""
    return f"{DISTRIBUTION} {version()} (revision {revision()}, {build})"
