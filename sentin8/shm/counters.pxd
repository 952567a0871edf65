# C layout of a worker's counter handle (Cython pure-Python mode; counters.py stays the source). The block and
# the header are typed views of the shared words: each update is a C load and store on the mapping, not a
# memoryview item call and a Python int.
cdef class WorkerCounters:
    cdef public unsigned long long[::1] words, _header
    cdef public Py_ssize_t services
