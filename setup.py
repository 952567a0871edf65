"""Build hook only (the project is declared in pyproject.toml): record the git revision in the wheel.

``sentin8/version.py`` reads the revision from git when it runs from a checkout; an installed wheel has no
``.git``, so ``build_py`` writes ``sentin8/_revision.txt`` into the build tree (never into the source tree).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _version_module():
    """sentin8/version.py alone (stdlib only): importing the package would run its native-build guard."""
    spec = importlib.util.spec_from_file_location("_sentin8_version", HERE / "sentin8" / "version.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildWithRevision(build_py):
    def run(self) -> None:
        super().run()
        v = _version_module()
        rev = v.git_revision(HERE) or v.UNKNOWN
        target = Path(self.build_lib) / "sentin8" / v.REVISION_FILE
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(rev + "\n")


setup(cmdclass={"build_py": BuildWithRevision})
