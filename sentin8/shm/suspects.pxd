# C layout of the shared suspect marks (Cython pure-Python mode; suspects.py stays the source): the table's
# words are a typed view of the mapping, and the per-request lookup's key, probe and slot are C integers, so
# a lookup is C loads and arithmetic, not memoryview item calls and Python ints.
cimport cython

cdef class SuspectTable:
    cdef public unsigned long long[::1] _w
    cdef public Py_ssize_t _mask
    cdef public object _key
    @cython.locals(k="unsigned long long", key="unsigned long long", p=Py_ssize_t, slot=Py_ssize_t)
    cpdef suspect_until(self, instance_id)
