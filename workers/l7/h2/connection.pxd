cimport cython
from workers.l7.h2.lifecycle cimport ConnectionLifecycle
from workers.l7.h2.send_deadline cimport SendDeadlines
from workers.l7.h2.stream cimport H2Stream
from workers.l7.exchange cimport Exchange
from workers.l7.request cimport Request
from sentin8.http.framing cimport measured_budget

cdef class H2Bridge(ConnectionLifecycle):
    # the connection's calls on itself per stream and per write (from data_received, flush, the streams'
    # ends): C calls
    cpdef _event(self, ev)
    @cython.locals(st=H2Stream, ex=Exchange, req=Request)
    cpdef _open(self, ev)
    cpdef stream_done(self, st)
    @cython.locals(sd=SendDeadlines)
    cpdef _forget(self, H2Stream st)
    cpdef _end_stream_request(self, H2Stream st)
    cpdef flush_soon(self)
    cpdef _flush_now(self)
    @cython.locals(sd=SendDeadlines)
    cpdef flush(self)
