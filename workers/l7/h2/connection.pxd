cimport cython
from workers.l7.h2.lifecycle cimport ConnectionLifecycle
from workers.l7.h2.send_deadline cimport SendDeadlines
from workers.l7.h2.stream cimport H2Stream
from sentin8.http.framing cimport measured_budget

cdef class H2Bridge(ConnectionLifecycle):
    # the connection's calls on itself per stream and per write (from data_received, flush, the streams'
    # ends): C calls. _open stays a def: it builds a closure, which a cpdef method cannot hold.
    cpdef _event(self, ev)
    cpdef stream_done(self, H2Stream st)
    @cython.locals(sd=SendDeadlines)
    cpdef _forget(self, H2Stream st)
    cpdef _end_stream_request(self, H2Stream st)
    cpdef flush_soon(self)
    cpdef _flush_now(self)
    @cython.locals(sd=SendDeadlines)
    cpdef flush(self)
