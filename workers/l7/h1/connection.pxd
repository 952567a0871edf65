from workers.l7.h1.reader cimport RequestReader

cimport cython
from sentin8.http.framing cimport RequestHead
from workers.l7.exchange cimport Exchange
from workers.l7.request cimport Request

cdef class L7Bridge(RequestReader):
    # the Downstream calls an exchange makes per request that are the connection's own (writer.pxd has the rest)
    cpdef body_taken(self)
    @cython.locals(req=Request, head=RequestHead)
    cpdef exchange_done(self, ex)
    # the request bookkeeping and the read pauses of every request: C calls
    cpdef _enqueue(self, req)
    @cython.locals(req=Request)
    cpdef _end_request(self, req)
    @cython.locals(ex=Exchange, req=Request, head=RequestHead)
    cpdef _start(self, req)
    cpdef resume_reading(self, bit)
    @cython.locals(req=Request, head=RequestHead)
    cpdef bint _said_its_last(self, req)
