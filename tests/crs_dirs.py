"""Where the tests find the two CRS releases, and small CRS directories built from them in tmp dirs.

CRS 3.3.4 is Debian's ``modsecurity-crs`` (``./dev`` installs it). CRS 4.28.0 is test data outside the repo
(``../shared/crs/v4.28.0``, resolved from the repo root so every checkout finds it); the tests that need it are
skipped, with the reason, where it is absent. Neither is copied into the repo.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CRS_V3_RULES = Path("/usr/share/modsecurity-crs/rules")
CRS_V4_ROOT = (REPO / ".." / "shared" / "crs" / "v4.28.0").resolve()
CRS_V4_RULES = CRS_V4_ROOT / "rules"

needs_v4 = pytest.mark.skipif(
    not (CRS_V4_RULES / "REQUEST-901-INITIALIZATION.conf").is_file(),
    reason=f"CRS v4.28.0 test data not found at {CRS_V4_RULES} (../shared/crs/v4.28.0 beside the repo)",
)

# Both rule sets, for tests that must hold on either: ids crs3 / crs4.
RULE_SETS = [
    pytest.param(str(CRS_V3_RULES), id="crs3"),
    pytest.param(str(CRS_V4_RULES), id="crs4", marks=needs_v4),
]


def crs_copy(dest: Path, source: Path, skip: tuple[str, ...] = ()) -> Path:
    """``dest/rules``: symlinks to every file of the ``source`` rules directory but ``skip``; returns it."""
    rules = dest / "rules"
    rules.mkdir(parents=True)
    for f in source.iterdir():
        if f.name not in skip:
            os.symlink(f, rules / f.name)
    return rules
