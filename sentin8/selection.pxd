# C layout of backend selection (Cython pure-Python mode; selection.py stays the source): Backends holds its
# Selector typed (backends.pxd), so ordering a request's candidates is a C call, and so is the eligible-set
# cache lookup inside it.
cdef class Selector:
    cdef public object marks
    cdef public dict _next, _eligible
    cdef public double health_fresh_s
    cdef public long long suspect_ttl_us
    cpdef tuple order(self, service, instances, now, health_now=*)
    cpdef list _eligible_now(self, service, instances, now)
