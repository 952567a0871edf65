"""One WAF transaction through libmodsecurity's C API: the calls ``WafEngine.inspect`` makes per request.

Compiled (``waf_calls.pxd``), they go through C function pointers taken once from the ctypes library that
``sentin8/waf.py`` loaded: a ctypes call converts every argument and releases and retakes the GIL, and a
benign GET with ten headers made ~25 of them (~15% of its inspection on the bench's WAF row, perf). The GIL
is released around the calls that evaluate rules (the request-header, request-body and logging phases), as
ctypes did, so the event loop runs beside them; the calls that only hand the engine a value hold it for their
microsecond. Pure, the same calls through ctypes, with the signatures ``waf.py`` declared.

Invariant, both builds: every transaction made is cleaned up, and its intervention with it, whatever raised.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

try:
    import cython  # the compiled build calls the engine directly (Cython decides it at compile time)
except ImportError:  # a pure install without Cython: every call through ctypes

    class cython:  # type: ignore[no-redef]
        compiled = False


if TYPE_CHECKING:
    from sentin8.waf import WafRequest

RULE_IDS_MAX = 32  # matched rule ids reported per request (the rest are counted as truncated)


class Intervention(ctypes.Structure):
    """libmodsecurity's ``ModSecurityIntervention`` (the pure build's; the compiled one is waf_calls.pxd's)."""

    _fields_ = [
        ("status", ctypes.c_int),
        ("pause", ctypes.c_int),
        ("url", ctypes.c_char_p),
        ("log", ctypes.c_char_p),
        ("disruptive", ctypes.c_int),
    ]


class Transactions:
    """The per-transaction calls of one loaded engine library, bound once (an engine holds one)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        if cython.compiled:
            self._bind(lib)

    def _bind(self, lib: ctypes.CDLL) -> None:
        """Compiled only: each function's address, as the C pointer type waf_calls.pxd gives it."""
        self._c_new = cython.cast(_new_fn, _address(lib.msc_new_transaction_with_id))  # noqa: F821
        self._c_connection = cython.cast(_connection_fn, _address(lib.msc_process_connection))  # noqa: F821
        self._c_uri = cython.cast(_uri_fn, _address(lib.msc_process_uri))  # noqa: F821
        self._c_header = cython.cast(_header_fn, _address(lib.msc_add_n_request_header))  # noqa: F821
        self._c_headers_done = cython.cast(_tx_fn, _address(lib.msc_process_request_headers))  # noqa: F821
        self._c_body = cython.cast(_body_fn, _address(lib.msc_append_request_body))  # noqa: F821
        self._c_body_done = cython.cast(_tx_fn, _address(lib.msc_process_request_body))  # noqa: F821
        self._c_intervention = cython.cast(_intervention_fn, _address(lib.msc_intervention))  # noqa: F821
        cleanup_fn = _address(lib.msc_intervention_cleanup)
        self._c_intervention_cleanup = cython.cast(_intervention_cleanup_fn, cleanup_fn)  # noqa: F821
        self._c_rule_ids = cython.cast(_rule_ids_fn, _address(lib.msc_get_rules_messages_rule_ids))  # noqa: F821
        self._c_logging = cython.cast(_tx_fn, _address(lib.msc_process_logging))  # noqa: F821
        self._c_cleanup = cython.cast(_cleanup_fn, _address(lib.msc_transaction_cleanup))  # noqa: F821

    def run(self, msc: int, rules: int, tx_id: bytes, req: WafRequest) -> tuple[bool, int, tuple[int, ...]]:
        """One transaction of ``req`` on the engine ``msc`` with the rule set ``rules``: (blocked, the engine's
        status when blocked else 0, the matched rule ids in the order the engine reports them, each once)."""
        if cython.compiled:
            return self._run_compiled(msc, rules, tx_id, req)
        lib = self._lib
        tx = lib.msc_new_transaction_with_id(msc, rules, tx_id, None)
        if not tx:
            raise MemoryError("msc_new_transaction")
        it = Intervention()
        try:
            blocked = self._phases(lib, tx, req, it)
            status = it.status if blocked else 0
            ids = (ctypes.c_int64 * RULE_IDS_MAX)()
            n = lib.msc_get_rules_messages_rule_ids(tx, ids, RULE_IDS_MAX)
            rule_ids = tuple(dict.fromkeys([int(ids[k]) for k in range(min(n, RULE_IDS_MAX))]))
            lib.msc_process_logging(tx)
        finally:
            lib.msc_intervention_cleanup(ctypes.byref(it))
            lib.msc_transaction_cleanup(tx)
        return blocked, status, rule_ids

    @staticmethod
    def _phases(lib: ctypes.CDLL, tx: int, req: WafRequest, it: Intervention) -> bool:
        """Pure: the phases in order; True as soon as one of them intervenes (the CRS blocks in phase 2)."""

        def stop() -> bool:
            return bool(lib.msc_intervention(tx, ctypes.byref(it))) and bool(it.disruptive)

        lib.msc_process_connection(tx, req.client_ip.encode(), req.client_port, b"0.0.0.0", req.server_port)
        if stop():
            return True
        # the engine takes a NUL-terminated target; llhttp never lets a NUL byte through
        lib.msc_process_uri(tx, req.target, req.method, req.version.encode())
        if stop():
            return True
        add = lib.msc_add_n_request_header
        for name, value in engine_headers(req):
            add(tx, name, len(name), value, len(value))
        lib.msc_process_request_headers(tx)
        if stop():
            return True
        if req.body:
            lib.msc_append_request_body(tx, req.body, len(req.body))
        lib.msc_process_request_body(tx)  # always: the CRS decides in phase 2
        return stop()

    def _run_compiled(self, msc: int, rules: int, tx_id: bytes, req: WafRequest) -> tuple[bool, int, tuple[int, ...]]:
        """Compiled only: ``run`` through the C pointers (the C names are waf_calls.pxd's)."""
        tx = cython.declare(
            cython.p_void,
            self._c_new(cython.cast(cython.p_void, msc), cython.cast(cython.p_void, rules), tx_id, cython.NULL),
        )
        if tx == cython.NULL:
            raise MemoryError("msc_new_transaction")
        it = cython.declare(_intervention)  # noqa: F821
        it.status = it.pause = it.disruptive = 0
        it.url = it.log = cython.NULL
        try:
            blocked = self._phases_compiled(tx, req, cython.address(it))
            status = it.status if blocked else 0
            ids = cython.declare(cython.longlong[32])  # RULE_IDS_MAX
            n = cython.declare(cython.size_t, self._c_rule_ids(tx, ids, RULE_IDS_MAX))
            rule_ids = tuple(dict.fromkeys([ids[k] for k in range(min(n, RULE_IDS_MAX))]))
            logging = cython.declare(_tx_fn, self._c_logging)  # noqa: F821
            with cython.nogil:
                logging(tx)
        finally:
            self._c_intervention_cleanup(cython.address(it))
            self._c_cleanup(tx)
        return blocked, status, rule_ids

    def _phases_compiled(self, tx, req: WafRequest, it) -> bool:
        """Compiled only: ``_phases`` through the C pointers, the GIL released around the rule phases."""
        ip = req.client_ip.encode()
        self._c_connection(tx, ip, req.client_port, b"0.0.0.0", req.server_port)
        if self._c_intervention(tx, it) and it.disruptive:
            return True
        version = req.version.encode()
        self._c_uri(tx, req.target, req.method, version)  # NUL-terminated: llhttp lets no NUL byte through
        if self._c_intervention(tx, it) and it.disruptive:
            return True
        for name, value in engine_headers(req):
            self._c_header(tx, name, len(name), value, len(value))
        headers_done = cython.declare(_tx_fn, self._c_headers_done)  # noqa: F821
        body_done = cython.declare(_tx_fn, self._c_body_done)  # noqa: F821
        with cython.nogil:
            headers_done(tx)
        if self._c_intervention(tx, it) and it.disruptive:
            return True
        body = req.body
        if body:
            self._c_body(tx, body, len(body))
        with cython.nogil:
            body_done(tx)  # always: the CRS decides in phase 2
        return bool(self._c_intervention(tx, it) and it.disruptive)


def engine_headers(req: WafRequest) -> list[tuple[bytes, bytes]]:
    """The request's headers as the engine gets them: Host is the name the proxy resolved (what exclusions and
    rules compare), in the client's Host field's place, or last when the client sent none."""
    host = req.host.encode()
    out = []
    seen_host = False
    for name, value in req.headers:
        if len(name) == 4 and name.lower() == b"host":
            value, seen_host = host, True
        out.append((name, value))
    if not seen_host:
        out.append((b"Host", host))
    return out


def _address(function: object) -> int:
    """A ctypes function's C address."""
    return ctypes.cast(function, ctypes.c_void_p).value or 0
