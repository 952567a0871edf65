# C layout of a backend connect (Cython pure-Python mode; connect.py stays the source).
from sentin8.backends cimport Backends
from workers.poll_set cimport PollSet

cdef class ConnectAttempt:
    cdef public PollSet poll
    cdef public object addr, on_done, sock, timer
    cdef public double deadline
    cdef public int family
    cpdef start(self)

cdef class BackendConnect:
    cdef public PollSet poll
    cdef public Backends backends
    cdef public list order
    cdef public double timeout
    cdef public object on_done, trying
    cdef public Py_ssize_t next_index
    cpdef start(self)
