# C layout of the TLS record layer (Cython pure-Python mode; tls_layer.py stays the source): every field of a
# connection's layer is a C struct member; all stay public (the worker's subclass and the tests read them).
from sentin8.tls_connection cimport RecordIO

cdef class TLSLayer:
    cdef public object _app, _app_factory, _app_paused, _app_transport, _closing, _conn, _context, _deliver_scheduled, _eof_delivered, _fail_reason, _fatal_exc, _handshake_done, _handshake_failed, _handshake_timeout, _hs_future, _loop, _lost, _on_handshake_done, _on_handshake_error, _peercert_der, _pending, _raw, _raw_eof, _raw_paused_writing, _shutdown_sent, _tickets_held, _timer, _timers, _write_eof_called
    cdef public bint _flush_scheduled
    cdef public Py_ssize_t _soon_bytes
    cdef public RecordIO _io  # typed: its per-record calls are C calls
    # the record path's steps, called on itself per read and per write: C calls
    cpdef _flush(self)
    cpdef _deliver(self)
    cpdef write_soon(self, data)
    cpdef bint _take(self, data)
    cpdef _encrypt(self, data)
