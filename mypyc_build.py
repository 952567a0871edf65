"""Compile the hot sans-IO modules with mypyc, in place: ``./dev compile`` (or ``SENTIN8_MYPYC=1 ./dev …``).

Optional at install. The ``.py`` files stay the one source: mypyc turns each listed module into a C extension
(``<module>.cpython-3xx-….so``) beside its ``.py``, and Python's import system prefers an extension to a source
file in the same directory, so the compiled build and the pure one are the same code run two ways. Without a
build nothing changes. The list is ``sentin8.native.MODULES``; ``bench/native.py`` measures
what each module gains.

    python mypyc_build.py build    compile (needs the ``compile`` extra and a C compiler); exit 0 even when
                                   compilation fails: the pure modules then run, and it says so loudly
    python mypyc_build.py clean    remove the compiled modules: back to pure Python
    python mypyc_build.py check    exit 0 when compiled modules are present and built from the current sources,
                                   1 when none are present, 2 when they are stale (built from other sources)

A stale build is the one real hazard: an extension built from yesterday's source would shadow today's edit.
The stamp (a hash of the listed sources and the interpreter's ABI, ``sentin8.native.fingerprint``) catches it:
``./dev`` removes or rebuilds a stale build before it runs anything, and ``sentin8.native.guard`` makes any
process that still meets one (systemd after an in-place upgrade) load the ``.py`` files instead.
"""

from __future__ import annotations

import importlib.machinery
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent
GROUP = "sentin8.native"  # mypyc's shared runtime library: sentin8/native__mypyc.<abi>.so, inside the package


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


def source(module: str) -> Path:
    return native.source(module)


def extensions() -> list[Path]:
    """Every compiled file this build may have left, present or not."""
    out = []
    for module in [*modules(), native.RUNTIME]:
        base = source(module).with_suffix("")
        out += [base.with_name(base.name + suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    return out


def present() -> list[Path]:
    return [p for p in extensions() if p.exists()]


def clean() -> None:
    for p in present():
        p.unlink()
    STAMP.unlink(missing_ok=True)


def check() -> int:
    return {"compiled": 0, "pure": 1, "stale": 2}[native.state()]


def build() -> int:
    clean()  # never a mix of old and new extensions
    try:
        from mypyc.build import mypycify
        from setuptools import setup
    except ImportError as exc:
        return _fallback(f"mypyc is not installed ({exc}); pip install -e '.[compile]'")
    paths = [str(source(m).relative_to(ROOT)) for m in modules()]
    temp = Path(tempfile.mkdtemp(prefix="sentin8-mypyc-"))
    try:
        ext = mypycify(paths, group_name=GROUP, opt_level="3", debug_level="0", target_dir=str(temp / "c"))
        setup(
            name="sentin8-native",
            ext_modules=ext,
            script_args=["-q", "build_ext", "--inplace", "--build-temp", str(temp / "o"), "--build-lib", str(temp)],
        )
    except (Exception, SystemExit) as exc:  # no C compiler, a mypyc error: the pure modules still run
        clean()
        return _fallback(f"compilation failed: {exc!r}")
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    missing = [m for m in modules() if not source(m).with_suffix(suffix).exists()]
    if missing:
        clean()
        return _fallback(f"the build left no extension for {', '.join(missing)}")
    STAMP.write_text(f"{native.fingerprint()} mypy {_mypy_version()}\n")
    print(f"mypyc: compiled in place: {', '.join(modules())}", file=sys.stderr)
    return 0


def _mypy_version() -> str:
    from mypy.version import __version__

    return __version__


def _fallback(reason: str) -> int:
    bar = "!" * 100
    print(
        f"{bar}\nmypyc: {reason}\nmypyc: running PURE PYTHON (same code, slower); nothing else changes\n{bar}",
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
