from workers.l7.h2.lifecycle cimport ConnectionLifecycle

cdef class H2Bridge(ConnectionLifecycle):
    pass
