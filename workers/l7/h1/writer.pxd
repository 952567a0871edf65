# C layout of the response half of an h1 client connection (Cython pure-Python mode; writer.py stays the source).
# ResponseWriter is the Downstream of the h1 connection: RequestReader (reader.pxd) derives from it and L7Bridge
# from that, one line of cdef bases, so the exchange's calls on its client reach these methods in C. The fields
# the response half uses are declared here; reader.pxd declares the rest of the bridge's.
from sentin8.http.h1_response cimport H1Response
from sentin8.http.response cimport coalesce
from workers.l7.downstream cimport Downstream

cdef class ResponseWriter(Downstream):
    cdef public H1Response _resp
    cdef public object transport, _out, _send, _ex, _closing, _draining
    cdef public Py_ssize_t max_buffered
    cpdef send_head(self, status, reason, headers, body)
    cpdef send_body(self, data)
    cpdef send_end(self)
    cpdef flush(self)
    cpdef write(self, data)
