# C layout of a client connection's read pauses (Cython pure-Python mode; flow.py stays the source): the reader
# and the connection test and move the bits on every request, so they are a struct member and C calls.
cdef class ReadPause:
    cdef public Py_ssize_t bits, hold_limit
    cdef public object transport
    cpdef pause(self, Py_ssize_t bit)
    cpdef bint resume(self, Py_ssize_t bit)
    cpdef held(self, Py_ssize_t total)
    cpdef bint raise_hold_limit(self, Py_ssize_t limit, Py_ssize_t held)
