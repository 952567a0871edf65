"""Compile the per-request hot path with Cython, in place: ``./dev`` does it by default (``./dev pure`` undoes it).

The ``.py`` files stay the one source. Cython compiles each listed module in pure-Python mode (the module
unchanged, plus an augmenting ``<module>.pxd`` beside it where one exists: ``cdef`` classes with typed
attributes, ``cpdef`` hot methods) into a C extension (``<module>.cpython-3xx-….so``) beside its ``.py``;
Python's import system prefers an extension to a source file in the same directory, so the compiled build and
the pure one are the same code run two ways. The list is ``sentin8.native.MODULES``; docs/compiled.md says
what is compiled and what it bought.

    python cython_build.py build    compile (needs the ``compile`` extra, a C compiler and the Python headers);
                                    exit 0 even when compilation fails: the pure modules then run, and it says
                                    so loudly
    python cython_build.py clean    remove the compiled modules: back to pure Python
    python cython_build.py check    exit 0 when compiled modules are present and built from the current sources,
                                    1 when none are present, 2 when they are stale (built from other sources)

A stale build is the one real hazard: an extension built from yesterday's source would shadow today's edit.
The stamp (a hash of the listed sources, their ``.pxd`` files and the interpreter's ABI,
``sentin8.native.fingerprint``) catches it: ``./dev`` rebuilds a stale build before it runs anything, and
``sentin8.native.guard`` makes any process that still meets one (systemd after an in-place upgrade) load the
``.py`` files instead. The generated C and object files live in ``build/cython/`` (kept, so a rebuild after an
edit recompiles only what the edit touched).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent
WORK = ROOT / "build" / "cython"  # generated C and objects: never beside the sources

# Semantics of the pure module, kept: annotations are documentation (a ``bytes`` parameter still takes the
# ``bytearray`` or ``memoryview`` pure Python would take); only what a ``.pxd`` declares is typed in C.
DIRECTIVES = {
    "language_level": 3,
    "annotation_typing": False,
    "binding": True,  # functions keep their signature and ``__wrapped__``-friendly metadata, as in pure Python
    "embedsignature": True,
}


def _native() -> ModuleType:
    """sentin8/native.py, loaded by path: not through the package, whose import runs the guard."""
    spec = importlib.util.spec_from_file_location("sentin8_native_build", ROOT / "sentin8" / "native.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


native = _native()
STAMP = native.stamp()


def modules() -> list[str]:
    """The dotted names of the modules compiled (``sentin8.native.MODULES``)."""
    return list(native.MODULES)


def extension_specs() -> list:
    """One setuptools ``Extension`` per listed module, its ``.py`` (relative to the tree) the one source: the
    in-place build and the wheel's (``setup.py``) compile the same list the same way."""
    from setuptools import Extension

    return [Extension(m, [str(source(m).relative_to(ROOT))]) for m in modules()]


def stamp_text(root: Path, cython_version: str) -> str:
    """What a complete build writes to ``sentin8/native.stamp`` under ``root``: the fingerprint of the sources
    as they sit there (``sentin8.native.guard`` compares it at every start), then the Cython that compiled."""
    return f"{native.fingerprint(root)} cython {cython_version}\n"


def source(module: str) -> Path:
    return native.source(module)


def extensions() -> list[Path]:
    """Every compiled file a build may have left beside a listed module, present or not."""
    out = []
    for module in modules():
        base = source(module).with_suffix("")
        out += [base.with_name(base.name + suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    return out


def present() -> list[Path]:
    """Compiled files beside the sources: the listed modules' and any left by a module since unlisted."""
    found = {p for p in extensions() if p.exists()}
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for top in ("sentin8", "workers", "supervisor"):
        found.update((ROOT / top).rglob(f"*{suffix}"))
    return sorted(found)


PXD_MANIFEST = WORK / "pxd-files"  # the .pxd files the last complete build saw


def _pxd_files() -> list[str]:
    return [str(p.relative_to(ROOT)) for m in modules() if (p := source(m).with_suffix(".pxd")).exists()]


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def clean() -> None:
    for p in present():
        p.unlink()
    STAMP.unlink(missing_ok=True)


def check() -> int:
    return {"compiled": 0, "pure": 1, "stale": 2}[native.state()]


def build() -> int:
    STAMP.unlink(missing_ok=True)  # until the build is complete, whatever is present counts as stale
    try:
        import Cython
        from Cython.Build import cythonize
        from setuptools import setup
    except ImportError as exc:
        clean()
        return _fallback(f"Cython is not installed ({exc}); pip install -e '.[compile]'")
    listed = set(extensions())
    for p in present():  # a module no longer listed must not keep shadowing its source
        if p not in listed:
            p.unlink()
    exts = extension_specs()
    # Cython's incremental build looks at the .pxd files that exist: one removed since the last build (a checkout
    # of an older commit) leaves C generated for a cdef class that is gone, which fails at import. Regenerate all.
    pxds = _pxd_files()
    removed = sorted(set(_read_lines(PXD_MANIFEST)) - set(pxds))
    if removed:
        print(f"cython: {len(removed)} .pxd file(s) gone since the last build ({removed[0]}...): full rebuild",
              file=sys.stderr)  # fmt: skip
    jobs = str(os.cpu_count() or 1)
    warnings.filterwarnings("ignore", message=".*tool.setuptools.*")  # pyproject's table, read by setup(): noise
    try:
        ext_modules = cythonize(
            exts,
            compiler_directives=DIRECTIVES,
            build_dir=str(WORK / "c"),
            nthreads=int(jobs),
            quiet=True,
            force=bool(removed),
        )
        setup(
            name="sentin8-compiled",
            ext_modules=ext_modules,
            script_args=[
                "-q", "build_ext", "--inplace", "-j", jobs,
                "--build-temp", str(WORK / "o"), "--build-lib", str(WORK / "lib"),
            ],
        )
    except (Exception, SystemExit) as exc:  # no C compiler, no headers, a Cython error: the pure modules run
        clean()
        return _fallback(f"compilation failed: {exc!r}")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    missing = [m for m in modules() if not source(m).with_suffix(suffix).exists()]
    if missing:
        clean()
        return _fallback(f"the build left no extension for {', '.join(missing)}")
    PXD_MANIFEST.write_text("".join(f"{p}\n" for p in pxds))
    STAMP.write_text(stamp_text(ROOT, Cython.__version__))
    print(f"cython: compiled in place: {len(modules())} modules (sentin8.native.MODULES)", file=sys.stderr)
    return 0


def _fallback(reason: str) -> int:
    bar = "!" * 100
    print(
        f"{bar}\nWARNING: cython: {reason}\n"
        f"WARNING: running PURE PYTHON (the same code, not compiled); nothing else changes\n{bar}",
        file=sys.stderr,
    )
    return 0


def main(argv: list[str]) -> int:
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "build":
        return build()
    if cmd == "clean":
        clean()
        return 0
    if cmd == "check":
        return check()
    print(__doc__, file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv))
