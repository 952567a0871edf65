# C layout of the fleet's ticket key ring (Cython pure-Python mode; ticketkeys.py stays the source): a ticket's
# seal and open ask it for the current keys on every handshake, as C calls over C fields.
cimport cython

cdef class TicketKeyRing:
    cdef public object _gen, _view, clock, _cached
    cdef public double rotation_s
    cdef public Py_ssize_t rotations
    @cython.locals(t=double)
    cpdef Py_ssize_t epoch(self, now=*) except? -1
    @cython.locals(epoch=Py_ssize_t, cached=tuple)
    cpdef tuple keys(self)
    cpdef lookup(self, bytes name)
