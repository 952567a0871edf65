from workers.l7.relay cimport ResponseRelay
from workers.l7.admission cimport admit

cdef class Exchange(ResponseRelay):
    # the steps of one request that call each other (relay.pxd has the rest): C calls
    cpdef _to(self, state)
    cpdef routed(self, service, sidx, host)
    cpdef forward(self)
    cpdef _attach(self, conn, inst, warm)
    cpdef _response_done(self)
    cpdef _finish(self, reuse, abort=*)
