from workers.l7.relay cimport ResponseRelay

cdef class Exchange(ResponseRelay):
    pass
