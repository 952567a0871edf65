"""Reach the bundled OpenSSL's functions that pyOpenSSL's cffi bindings leave out.

pyOpenSSL drives the OpenSSL that the ``cryptography`` wheel links statically into its Rust extension
(``cryptography.hazmat.bindings._rust``). Its cffi ``lib`` binds what pyOpenSSL needs, which does not include
``SSL_CTX_set_tlsext_ticket_key_evp_cb``, ``EVP_EncryptInit_ex`` or ``EVP_MAC_CTX_set_params`` (needed to
seal session tickets with fleet-wide keys). The extension does not export them dynamically, but it keeps its
static symbol table: this module reads that table once (ELF64, ``.symtab`` + ``.strtab``), adds the
extension's load address (``dladdr``), and makes cffi function pointers from the result (ABI mode, ``ffi``:
nothing to compile; a call through one costs a fraction of a ctypes call, which prepares its libffi call
interface anew every time).

Safety: before trusting any address, two functions cffi binds are resolved the same way and compared with the
addresses cffi itself holds for them (``ffi.addressof`` gives cffi's static wrapper ``_cffi_d_<name>``, which
is in the same symbol table). A mismatch (a stripped
or relinked wheel, another layout) makes ``resolve`` return None and callers fall back; never a guess.
"""

from __future__ import annotations

import ctypes
import mmap
import struct
from functools import cache

import cffi
from cryptography.hazmat.bindings._rust import _openssl
from OpenSSL import SSL

ffi = cffi.FFI()  # our declarations only; the callers add theirs (``ffi.cdef``)

_CHECKS = ("SSL_CTX_new", "SSL_CTX_set_alpn_select_cb")


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _cffi_address(name: str) -> int:
    # pyOpenSSL's ``SSL._lib`` is a plain module copied from the cffi ``Lib``; addressof needs the Lib itself.
    ffi, lib = _openssl.ffi, _openssl.lib
    return int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))


def _module_of(address: int) -> tuple[str, int] | None:
    """(file, load base) of the shared object that holds ``address``."""
    libdl = ctypes.CDLL(None)
    info = _DlInfo()
    if not libdl.dladdr(ctypes.c_void_p(address), ctypes.byref(info)) or not info.dli_fname:
        return None
    return info.dli_fname.decode(), int(info.dli_fbase or 0)


def elf_symbols(path: str, names: set[str]) -> dict[str, int]:
    """``st_value`` of each of ``names`` found in the ELF64 little-endian file's ``.symtab`` (functions)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return _elf_symbols(data, names)


def _elf_symbols(data: mmap.mmap, names: set[str]) -> dict[str, int]:
    # Only the section headers, the symbol table and its strings are read from the 14 MB module.
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return {}
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    found: dict[str, int] = {}
    for sh in sections:
        if sh[1] != 2:  # SHT_SYMTAB
            continue
        strtab = sections[sh[6]]  # sh_link: the section of the names
        str_off, str_size = strtab[4], strtab[5]
        strings = data[str_off : str_off + str_size]
        wanted: dict[int, str] = {}
        for name in names:  # offsets of the wanted names in the string table, then one pass over symbols
            needle = b"\0" + name.encode() + b"\0"
            pos = strings.find(needle)
            while pos != -1:
                wanted[pos + 1] = name
                pos = strings.find(needle, pos + 1)
        sym_off, sym_size = sh[4], sh[5]
        for st_name, st_info, _other, st_shndx, st_value, _size in struct.iter_unpack(
            "<IBBHQQ", data[sym_off : sym_off + sym_size]
        ):
            name = wanted.get(st_name)
            if name is not None and st_shndx != 0 and st_info & 0xF == 2:  # defined, STT_FUNC
                found[name] = st_value
    return found


@cache
def resolve(names: tuple[str, ...]) -> dict[str, int] | None:
    """Absolute addresses of ``names`` in the OpenSSL pyOpenSSL uses, or None when they cannot be proven."""
    try:
        known = {n: _cffi_address(n) for n in _CHECKS}
        module = _module_of(known["SSL_CTX_new"])
        if module is None:
            return None
        path, base = module
        symbols = elf_symbols(path, set(names) | {"_cffi_d_" + n for n in _CHECKS})
    except (OSError, AttributeError, TypeError, struct.error, IndexError):
        return None
    if any(base + symbols.get("_cffi_d_" + n, -base) != addr for n, addr in known.items()):
        return None
    if any(n not in symbols for n in names):
        return None
    return {n: base + symbols[n] for n in names}


def function(address: int, signature: str) -> object:
    """The C function at ``address`` (from ``resolve``) as a cffi function pointer of type ``signature``
    (e.g. ``"int (*)(void *, size_t)"``): pointer arguments are cdata (``pointer``), not ints."""
    return ffi.cast(signature, address)


def pointer_of(cdata: object) -> int:
    """The address a pyOpenSSL cffi pointer (``ctx._context``, ``conn._ssl``) holds."""
    return int(SSL._ffi.cast("uintptr_t", cdata))


def pointer(cdata: object) -> object:
    """A pyOpenSSL cffi pointer as a ``void *`` of ``ffi``, for the functions ``function`` makes."""
    return ffi.cast("void *", pointer_of(cdata))
