from workers.l7.h1.reader cimport RequestReader

cimport cython
from workers.l7.exchange cimport Exchange

cdef class L7Bridge(RequestReader):
    # the Downstream calls an exchange makes per request that are the connection's own (writer.pxd has the rest)
    cpdef body_taken(self)
    cpdef exchange_done(self, ex)
    # the request bookkeeping and the read pauses of every request: C calls
    cpdef _enqueue(self, req)
    cpdef _end_request(self, req)
    @cython.locals(ex=Exchange)
    cpdef _start(self, req)
    cpdef resume_reading(self, bit)
