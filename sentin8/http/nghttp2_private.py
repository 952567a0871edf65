"""Give an idle HTTP/2 connection's frame buffer back to the kernel: nghttp2 keeps 16 KiB per session for life.

nghttp2 allocates, at session creation, one outgoing frame buffer of ``NGHTTP2_FRAMEBUF_CHUNKLEN`` (16,394
bytes: a frame header, a pad byte and a 16 KiB payload) and keeps it until the session is deleted
(``aob.framebufs``, ``chunk_keep`` = 1). Every frame is packed there and copied out by ``data_to_send``, after
which the buffer holds nothing: an idle connection carries 16 KiB of dead bytes, which nginx (its frames go
straight into the connection's output chain, freed when sent) does not. Neither nghttp2 nor ngh2 can size or
free it, so once the engine has sent everything the interior pages of that buffer are handed back with
``madvise(MADV_DONTNEED)``: the allocation stays (malloc's bookkeeping lies outside those pages), its pages
are unmapped, and the next frame packed there faults in zeroed pages. Measured with ``bench.idle_memory``
(bench/README.md, "idle memory"). Nothing of nghttp2's memory is ever written here.

Safety, as in ``sentin8/openssl_private.py`` and ``sentin8/http/llhttp_private.py``: nothing is trusted
unchecked. ngh2's ``Connection`` (a Cython class, ``_core.pyx``) holds, after the object header and Cython's
vtable pointer, ``role``, ``config`` and then the ``nghttp2_session *``: the first two must be the objects
its ``role`` and ``config`` attributes return. In the session the ``nghttp2_bufs`` is found once per
process, on a probe connection, by its values (head and cur on the same chain, ``mem`` pointing into the
session itself, chunk_length 16,394, max_chunk 4, chunk_keep 1, offset 10) and must be the only match; every
release checks them again, and also that no frame is in flight (``aob.item``, the word before, is NULL), one
chunk is in use and it is empty (``pos == last``). Any mismatch leaves the buffer as it is. ngh2 is pinned
exactly (pyproject.toml) and ``tests/test_idle_memory.py`` fails if the probe does.
"""

from __future__ import annotations

import ctypes
import mmap
from functools import cache

import ngh2

from sentin8.eventlog import event

_WORD = ctypes.sizeof(ctypes.c_void_p)
_SESSION_AT = 5 * _WORD  # ob_refcnt, ob_type, __pyx_vtab, role, config, then Connection._session
_SCAN_WORDS = 1024 // _WORD  # the bufs sit at byte 456 of the 2,776-byte nghttp2_session (nghttp2 1.70)
_CHUNKLEN = 9 + 1 + 16384  # NGHTTP2_FRAMEBUF_CHUNKLEN
_MAX_CHUNK = 4  # (max_send_header_block_length 65536 + CHUNKLEN - 1) // CHUNKLEN, ngh2's default option
_OFFSET = 9 + 1  # NGHTTP2_FRAME_HDLEN + 1 (the pad length field)
_PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4

_libc = ctypes.CDLL(None, use_errno=True)
_madvise = _libc.madvise
_madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_madvise.restype = ctypes.c_int


class _Bufs(ctypes.Structure):
    """``nghttp2_bufs`` (lib/nghttp2_buf.h)."""

    _fields_ = [
        ("head", ctypes.c_void_p),
        ("cur", ctypes.c_void_p),
        ("mem", ctypes.c_void_p),
        ("chunk_length", ctypes.c_size_t),
        ("max_chunk", ctypes.c_size_t),
        ("chunk_used", ctypes.c_size_t),
        ("chunk_keep", ctypes.c_size_t),
        ("offset", ctypes.c_size_t),
    ]


class _Chain(ctypes.Structure):
    """``nghttp2_buf_chain``: ``next`` then an ``nghttp2_buf`` (begin, end, pos, last, mark)."""

    _fields_ = [(n, ctypes.c_void_p) for n in ("next", "begin", "end", "pos", "last", "mark")]


def _session_of(conn: object) -> int | None:
    """The ``nghttp2_session *`` of an ngh2 connection, when the fields before it are what they must be."""
    if type(conn) is not ngh2.Connection or type(conn).__basicsize__ < _SESSION_AT + _WORD:
        return None
    base = id(conn)
    role = ctypes.c_void_p.from_address(base + _SESSION_AT - 2 * _WORD).value
    config = ctypes.c_void_p.from_address(base + _SESSION_AT - _WORD).value
    if role != id(conn.role) or config != id(conn.config):  # type: ignore[attr-defined]
        return None
    session = ctypes.c_void_p.from_address(base + _SESSION_AT).value
    return session if session and not session % _WORD else None


def _is_framebufs(session: int, at: int) -> bool:
    b = _Bufs.from_address(session + at)
    return (
        b.chunk_length == _CHUNKLEN
        and b.max_chunk == _MAX_CHUNK
        and b.chunk_keep == 1
        and b.offset == _OFFSET
        and 1 <= b.chunk_used <= _MAX_CHUNK
        and b.mem is not None
        and 0 <= b.mem - session < _SCAN_WORDS * _WORD * 4  # &session->mem: inside the session itself
        and b.head is not None
        and b.head == b.cur
    )


@cache
def framebufs_offset() -> int | None:
    """The byte offset of ``aob.framebufs`` in this build's ``nghttp2_session`` (proven once), or None."""
    probe = ngh2.Connection(ngh2.Role.SERVER, ngh2.Configuration())
    probe.initiate_connection({})
    probe.data_to_send()
    session = _session_of(probe)
    hits = []
    if session is not None:
        # a word-aligned scan; the bufs follow aob.item (so never at word 0)
        hits = [i * _WORD for i in range(1, _SCAN_WORDS - 8) if _is_framebufs(session, i * _WORD)]
    if len(hits) != 1:
        event("h2_framebuf_kept", "warning", ngh2=ngh2.__version__, matches=len(hits))
        return None
    return hits[0]


def release_framebuf(conn: object) -> int:
    """Hand the interior pages of ``conn``'s frame buffer to the kernel when nothing is in it; the bytes
    released (0 when the layout is not proven, a frame is in flight, or the buffer is in use)."""
    at = framebufs_offset()
    if at is None:
        return 0
    session = _session_of(conn)
    if session is None or not _is_framebufs(session, at):
        return 0
    if ctypes.c_void_p.from_address(session + at - _WORD).value:  # aob.item: a frame is being sent
        return 0
    bufs = _Bufs.from_address(session + at)
    if bufs.chunk_used != 1 or bufs.head is None:
        return 0
    chain = _Chain.from_address(bufs.head)
    if chain.next or chain.begin is None or chain.end is None or chain.pos != chain.last or chain.last is None:
        return 0
    if chain.end - chain.begin != _CHUNKLEN:
        return 0
    start = -(-chain.last // _PAGE) * _PAGE  # the first page boundary after the buffer's live bytes
    end = chain.end // _PAGE * _PAGE
    if end <= start or _madvise(start, end - start, _MADV_DONTNEED) != 0:
        return 0
    return end - start
