# C layout of a backend connection (Cython pure-Python mode; upstream.py stays the source).
cimport cython
from workers.deadline cimport Deadline
from workers.unread cimport UnreadWatch

cdef class UpstreamPool

cdef class UpstreamConn:
    cdef public UpstreamPool pool
    cdef public object instance_id, owner, ready, response_parser, transport
    cdef public list _out
    cdef public UnreadWatch unread
    cdef public Deadline _deadline
    cdef public bint closed, read_paused
    cdef public Py_ssize_t uses, _out_bytes
    cpdef send(self, data)
    cpdef send_lines(self, parts)
    cpdef write_out(self)
    # what the exchange and the pool call on a connection per request: C calls
    cpdef resume_reading(self)
    cpdef expect_response(self)
    cpdef idle(self)
    cpdef in_use(self)

# The worker's pool: every request takes a connection from it and gives it back, and its writes leave at the end
# of the turn (write_soon): the exchange holds it typed (contract.pxd), so these are C calls.
cdef class UpstreamPool:
    cdef public object loop, _writers
    cdef public dict _idle  # by instance: its get and setdefault are C calls on a dict
    cdef public Py_ssize_t max_idle
    cdef public double connect_timeout_s, idle_timeout_s, response_timeout_s, min_deadline_s
    cdef public bint _closed, _write_scheduled
    @cython.locals(conn=UpstreamConn, watch=UnreadWatch, stack=list)
    cpdef acquire(self, instance_id)
    cpdef write_soon(self, UpstreamConn conn)
    @cython.locals(conn=UpstreamConn)
    cpdef _write_now(self)
    @cython.locals(stack=list)
    cpdef release(self, UpstreamConn conn)
