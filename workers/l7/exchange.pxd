cimport cython
from workers.l7.relay cimport ResponseParser, ResponseRelay
from workers.l7.admission cimport admit
from workers.upstream cimport UpstreamConn

cdef class Exchange(ResponseRelay):
    # the steps of one request that call each other (relay.pxd has the rest): C calls
    cpdef _to(self, state)
    cpdef routed(self, service, sidx, host)
    cpdef forward(self)
    @cython.locals(parser=ResponseParser)
    cpdef _attach(self, UpstreamConn conn, inst, warm)
    cpdef _response_done(self)
    @cython.locals(parser=ResponseParser, conn=UpstreamConn)
    cpdef _finish(self, reuse, abort=*)
