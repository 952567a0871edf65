from workers.l7.h2.lifecycle cimport ConnectionLifecycle
from sentin8.http.framing cimport measured_budget

cdef class H2Bridge(ConnectionLifecycle):
    # the connection's calls on itself per stream and per write (from data_received, flush, the streams'
    # ends): C calls. _open stays a def: it builds a closure, which a cpdef method cannot hold.
    cpdef _event(self, ev)
    cpdef stream_done(self, st)
    cpdef _forget(self, st)
    cpdef _end_stream_request(self, st)
    cpdef flush_soon(self)
    cpdef _flush_now(self)
    cpdef flush(self)
