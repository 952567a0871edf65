from workers.l7.h1.reader cimport RequestReader

cdef class L7Bridge(RequestReader):
    pass
