# C layout of the accept-to-hand-off path (Cython pure-Python mode; door.py stays the source).
cimport cython
from sentin8.backends cimport Backends
from sentin8.holds cimport Hold
from sentin8.shm.counters cimport WorkerCounters
from workers.connect cimport BackendConnect
from workers.l4_pipe cimport PipePool, SplicePipe
from workers.poll_set cimport PollSet

cdef class Door:
    cdef public object loop, cfg, limits, conncap, lingering, serve_external, classifier, proxy_sources
    cdef public WorkerCounters counters
    cdef public Backends backends
    cdef public PollSet poll
    cdef public PipePool pipes
    cdef public Py_ssize_t index

cdef class Arrival:
    cdef public Door door
    cdef public object conn, addr, local
    cdef public Hold hold
    cdef public double deadline
    cdef public bint guaranteed_l4, handed_off, over_cap
    cdef public Py_ssize_t sidx
    cpdef start(self)
    cpdef _end(self)
    cpdef _peek(self, bint trusted)
    cpdef _route(self, hello, bint internal)
    cpdef _serve_external(self)
    cpdef _serve_l4(self, sni)
    cpdef _refuse(self)
    # an L4 connection's last steps: the pipe (and the connect before it) typed, its start and close C calls
    @cython.locals(pipe=SplicePipe)
    cpdef _connected(self, inst, backend)
    cpdef _pipe_closed(self, SplicePipe pipe)
