# C layout of a worker's counter handle (Cython pure-Python mode; counters.py stays the source).
cdef class WorkerCounters:
    cdef public object words, _header
    cdef public Py_ssize_t services
