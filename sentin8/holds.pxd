# C layout of a worker's connection holds (Cython pure-Python mode; holds.py stays the source): every
# connection takes one and releases it once, so the hold, its owner and the release are C structs and calls.
cdef class OpenConnections

cdef class Hold:
    cdef public OpenConnections _owner
    cdef public object _also
    cpdef also(self, release)
    cpdef release(self)

cdef class OpenConnections:
    cdef public object _gauges, _on_release
    cdef public Py_ssize_t count
    cpdef Hold hold(self)
    cpdef released_one(self)
