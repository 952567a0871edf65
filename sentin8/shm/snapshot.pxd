# C layout of the routing snapshot's reader side (Cython pure-Python mode; snapshot.py stays the source): the
# cache asks the reader's generation word twice per request (resolve, then candidates); typed, that is a C load
# and a C compare instead of a method call, a memoryview item call and a Python int compare.
cdef class SnapshotReader:
    cdef public object _raw
    cdef public const unsigned long long[::1] _w
    cdef public Py_ssize_t capacity, torn_reads
    cpdef long long generation(self)

cdef class SnapshotCache:
    cdef public SnapshotReader _reader
    cdef public object _decode, table
    cdef public long long _gen
    cdef public double published_at
    cdef public Py_ssize_t decodes
    cpdef current(self)
