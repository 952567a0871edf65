# C layout of an h1 client connection (Cython pure-Python mode; reader.py, writer.py and connection.py stay the
# source). The bases form one line: Downstream (ctx, loop, facts) <- ResponseWriter (the response half's
# fields, writer.pxd) <- RequestReader <- L7Bridge. Every other field of the bridge (its request half, its own
# in connection.py) is declared here, once, as a C struct member; all stay public. ``__dict__`` keeps the
# class-level defaults (``external``, ``refuse_status``...) settable per instance, as the worker and the tests
# do. body_taken and exchange_done are L7Bridge's (connection.pxd).
from sentin8.http.framing cimport request_line_is_http, validate_request
from workers.deadline cimport Deadline
from workers.l7.h1.flow cimport ReadPause
from workers.l7.h1.writer cimport ResponseWriter
from workers.l7.request cimport Request

cdef class RequestReader(ResponseWriter):
    cdef dict __dict__
    cdef public object client_addr, scheme
    cdef public Request _req, _upgrade_req
    cdef public object _feeding, _parser, _chunk_size, _version, _tunnel
    cdef public object _drain_timer, _drain_grace, _header_timeout, _idle_timeout
    cdef public object _queue, _idle_since, _send_timeout, _send_timer, _linger_timer  # connection.py's own
    cdef public Py_ssize_t _lingered
    cdef public object _eof, _progress, _completed_in_feed, _write_paused, _body_activity
    cdef public Py_ssize_t _body_cap, _head_raw, _max_header_bytes, _max_headers, _raw_head_cap
    cdef public Deadline _deadline
    cdef public ReadPause _read
    # L7Bridge's, called per request from the reader's callbacks and the bridge itself: C calls
    cpdef _enqueue(self, req)
