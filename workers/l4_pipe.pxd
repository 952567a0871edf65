# C layout of the L4 raw pipe (Cython pure-Python mode; l4_pipe.py stays the source): both directions and the
# pipe hold each other typed, so every readiness event runs on struct members and C calls.
from workers.poll_set cimport PollSet

# splice(2) as a C call in the compiled build (l4_pipe.py, "if cython.compiled")
cdef extern from "<fcntl.h>" nogil:
    Py_ssize_t c_splice "splice"(int, long long *, int, long long *, size_t, unsigned int)
    unsigned int c_SPLICE_F_MOVE "SPLICE_F_MOVE"
    unsigned int c_SPLICE_F_NONBLOCK "SPLICE_F_NONBLOCK"

cdef extern from "<errno.h>" nogil:
    int c_errno "errno"
    int c_EINTR "EINTR"
    int c_EAGAIN "EAGAIN"

cdef Py_ssize_t _splice(int src, int dst, size_t size) except -2

# poll_set's event bits held as C longs: a readiness event is tested in C, without an int object per test
cdef long IN, OUT, ERR, HUP

cdef class PipePool:
    cdef public list _free
    cdef public Py_ssize_t keep
    cpdef tuple get(self)
    cpdef put(self, tuple pair, bint empty)

cdef class SplicePipe

cdef class _Direction:
    cdef public SplicePipe owner
    cdef public object src, dst, pipe
    cdef public PipePool pool
    cdef public int src_fd, dst_fd
    cdef public Py_ssize_t pending, bytes
    cdef public bint ended, reading, writing
    cpdef start(self)
    cpdef on_readable(self)
    cpdef flush(self)
    cpdef _release_if_empty(self)
    cpdef release(self)
    cpdef on_writable(self)

cdef class SplicePipe:
    cdef public PollSet poll
    cdef public object client, backend, on_close
    cdef public PipePool pipes
    cdef public bint closed
    cdef public _Direction upstream, downstream
    cdef public int _client_fd, _backend_fd
    cpdef start(self, bytes preface=*)
    cpdef rewatch(self, int fd)
    cpdef _events(self, long events, _Direction reader, _Direction writer)
    cpdef direction_done(self, _Direction d)
    cpdef abort(self)
    cpdef _close(self)
