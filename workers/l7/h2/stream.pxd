# C layout of one h2 stream, the Downstream of its exchange (Cython pure-Python mode; stream.py stays the
# source); fields stay public. Its connection (as its cdef base), request and exchange are typed: the engine calls
# it makes per response (send_head, send_data, end_stream, consume) are C calls. Its ctx, loop and facts are the
# Downstream base's (downstream.pxd), and so are the per-request calls the exchange makes on it, overridden here.
from workers.deadline cimport Deadline
from workers.l7.downstream cimport Downstream
from workers.l7.exchange cimport Exchange
from workers.l7.h2.lifecycle cimport ConnectionLifecycle
from workers.l7.request cimport Request

cdef class H2Stream(Downstream):
    cdef public ConnectionLifecycle _conn  # the H2Bridge (its cdef base: connection.py imports this module)
    cdef public Exchange ex
    cdef public Request req
    cdef public Deadline body_deadline
    cdef public Py_ssize_t sid, unconsumed, submitted, hold
    cdef public bint continue_sent, ended, head_only, paused, write_paused
    cpdef stop_body_deadline(self)
    cpdef send_head(self, status, reason, headers, body)
    cpdef send_body(self, data)
    cpdef send_end(self)
    cpdef flush(self)
    cpdef body_taken(self)
    cpdef exchange_done(self, ex)
