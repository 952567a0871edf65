# C layout of a request (Cython pure-Python mode; request.py stays the source); fields stay public.
cdef class Request:
    cdef public object body, budget, exchange, head, headers, line_raw, upgrade_data, url
    cdef public Py_ssize_t buffered, received, reject, trailer_bytes
    cdef public bint complete, counted
    cdef public double t0
