# C layout of a connection's deadline (Cython pure-Python mode; deadline.py stays the source).
cdef class Deadline:
    cdef public object _handle, _loop, _on_expired, _time
    cdef public double _at, _handle_at, _horizon
    cdef public Py_ssize_t kind
    cpdef arm(self, Py_ssize_t kind, double delay)  # C values: no int object made to compare kinds
    cpdef double now(self)
    cpdef disarm(self)
    cpdef disarm_if(self, Py_ssize_t kind)
    cdef _arm(self, double now)
