from workers.l7.h1.reader cimport RequestReader

cdef class L7Bridge(RequestReader):
    # the Downstream calls an exchange makes per request that are the connection's own (writer.pxd has the rest)
    cpdef body_taken(self)
    cpdef exchange_done(self, ex)
