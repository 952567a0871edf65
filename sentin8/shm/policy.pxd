# C layout of a worker's runtime-policy cache (Cython pure-Python mode; policy.py stays the source): read once per
# request by the worker's context, which holds it typed (l7_context.pxd): a C call.
cdef class PolicyCache:
    cdef public object _reader, _word, _base, _gen, _value
    cdef public Py_ssize_t rebuilds
    cpdef current(self)
