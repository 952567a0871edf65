# C layout of the shared circuit breakers (Cython pure-Python mode; breakers.py stays the source): like the
# suspect marks, the words are a typed view of the mapping and the lookup is C integers. Every request asks
# ``allow`` and ``record`` of an instance that, healthy, has no entry: two probes that end at an empty slot.
cimport cython

cdef class BreakerTable:
    cdef public unsigned long long[::1] _w
    cdef public Py_ssize_t _mask
    cdef public object rules, clock, _key
    @cython.locals(key="unsigned long long", p=Py_ssize_t, slot=Py_ssize_t)
    cpdef Py_ssize_t _find(self, unsigned long long k) except? -2
    cpdef allow(self, instance_id)
    cpdef record(self, instance_id, ok)
