# C layout of the shared suspect marks (Cython pure-Python mode; suspects.py stays the source): the table's
# words are a typed view of the mapping, so a lookup per request is C loads, not memoryview item calls.
cdef class SuspectTable:
    cdef public unsigned long long[::1] _w
    cdef public Py_ssize_t _mask
    cdef public object _key
