# C layout of a request (Cython pure-Python mode; request.py stays the source); fields stay public.
from sentin8.http.framing cimport HeaderBudget, RequestHead

cdef class Request:
    cdef public object body, exchange, headers, line_raw, upgrade_data, url
    cdef public HeaderBudget budget
    cdef public RequestHead head
    cdef public Py_ssize_t buffered, received, reject, trailer_bytes
    cdef public bint complete, counted
    cdef public double t0
