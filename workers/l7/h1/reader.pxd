# C layout of an h1 client connection (Cython pure-Python mode; reader.py, writer.py and connection.py stay the
# source). RequestReader is the first base of L7Bridge, so every field of the bridge (its request half, its
# response half in writer.py, its own in connection.py) is declared here, once, as a C struct member; all stay
# public. ``__dict__`` keeps the class-level defaults (``external``, ``refuse_status``...) settable per
# instance, as the worker and the tests do.
from workers.deadline cimport Deadline
from workers.l7.contract cimport L7Context
from workers.l7.request cimport Request

cdef class RequestReader:
    cdef dict __dict__
    cdef public L7Context ctx  # typed: each of a request's calls on it is a C call
    cdef public object loop, facts, client_addr, scheme, transport
    cdef public Request _req, _upgrade_req
    cdef public object _read, _feeding, _parser, _chunk_size, _resp, _out, _ex, _tunnel, _send
    cdef public object _drain_timer, _drain_grace, _header_timeout, _idle_timeout
    cdef public object _closing, _draining, _eof, _progress, _completed_in_feed, _write_paused, _body_activity
    cdef public Py_ssize_t _body_cap, _head_raw, _max_header_bytes, _max_headers, _raw_head_cap, max_buffered
    cdef public Deadline _deadline
