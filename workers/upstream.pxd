# C layout of a backend connection (Cython pure-Python mode; upstream.py stays the source).
from workers.deadline cimport Deadline
from workers.unread cimport UnreadWatch

cdef class UpstreamConn:
    cdef public object instance_id, owner, pool, ready, response_parser, transport
    cdef public list _out
    cdef public UnreadWatch unread
    cdef public Deadline _deadline
    cdef public bint closed, read_paused
    cdef public Py_ssize_t uses, _out_bytes
    cpdef send(self, data)
    cpdef send_lines(self, parts)
    cpdef write_out(self)
