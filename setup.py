"""Build hooks only (the project is declared in pyproject.toml).

- ``build_py`` records the git revision in the wheel: ``sentin8/version.py`` reads the revision from git when it
  runs from a checkout; an installed wheel has no ``.git``, so ``sentin8/_revision.txt`` is written into the
  build tree (never into the source tree).
- ``build_ext`` compiles the hot path into the wheel, as aiohttp and uvloop ship theirs: the modules of
  ``sentin8.native.MODULES``, with the directives and ``.pxd`` files of ``./dev``'s in-place build
  (``cython_build.py``), then the stamp ``sentin8.native.guard`` checks at every start, computed over the
  sources as the wheel installs them. So the fleet systemd runs from the wheel is the build the bench measures.
  ``SENTIN8_PURE=1`` builds a pure wheel (any platform); without Cython, a C compiler or the Python headers the
  wheel is pure too, and the build says so in a WARNING, never silently. An editable install (``./dev``)
  compiles nothing here: ``cython_build.py`` builds that tree in place, with its own stamp.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _load(name: str, path: Path):
    """A module of the tree loaded by path: importing the package would run its native-build guard."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _builder():
    """cython_build.py, the in-place build's module: its module list, directives and stamp, loaded once."""
    return _load("_sentin8_cython_build", HERE / "cython_build.py")


class BuildWithRevision(build_py):
    def run(self) -> None:
        super().run()
        v = _load("_sentin8_version", HERE / "sentin8" / "version.py")
        rev = v.git_revision(HERE) or v.UNKNOWN
        target = Path(self.build_lib) / "sentin8" / v.REVISION_FILE
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(rev + "\n")


def _warn_pure(reason: str) -> None:
    bar = "!" * 100
    print(f"{bar}\nWARNING: sentin8 wheel: {reason}\nWARNING: this wheel runs PURE PYTHON (the same code, "
          f"not compiled; ~2.3x the instructions per request)\n{bar}", file=sys.stderr)  # fmt: skip


class CompileHotPath(build_ext):
    """Cython over the listed modules into ``build_lib``, all or none: a failure leaves the ``.py`` files alone
    in the wheel (no stamp, no extension), which run as the pure build."""

    def run(self) -> None:
        if self.inplace or getattr(self, "editable_mode", False):
            return  # ./dev's cython_build.py owns the in-place build
        lib = Path(self.build_lib)
        (lib / "sentin8" / "native.stamp").unlink(missing_ok=True)  # a build dir kept from an earlier wheel
        try:
            import Cython
            from Cython.Build import cythonize
        except ImportError as exc:
            _warn_pure(f"Cython is not installed in the build environment ({exc})")
            return
        builder = _builder()
        try:
            # the C files in place of the .py sources, on the Extension objects setuptools has already finalized
            generated = cythonize(
                self.extensions,
                compiler_directives=builder.DIRECTIVES,
                build_dir=os.path.join(self.build_temp, "cython"),
                nthreads=os.cpu_count() or 1,
                quiet=True,
            )
            sources = {ext.name: ext.sources for ext in generated}
            for ext in self.extensions:
                ext.sources = sources[ext.name]
            self.parallel = os.cpu_count() or 1
            super().run()
        except (Exception, SystemExit) as exc:  # no compiler, no headers, a Cython error
            for ext in self.extensions:
                Path(self.get_ext_fullpath(ext.name)).unlink(missing_ok=True)
            _warn_pure(f"compilation failed: {exc!r}")
            return
        (lib / "sentin8" / "native.stamp").write_text(builder.stamp_text(lib, Cython.__version__))


def _extensions() -> list:
    if os.environ.get("SENTIN8_PURE", "") not in ("", "0"):
        return []  # asked for: a pure wheel, tagged for any platform
    return _builder().extension_specs()


setup(cmdclass={"build_py": BuildWithRevision, "build_ext": CompileHotPath}, ext_modules=_extensions())
