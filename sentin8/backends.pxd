# C layout of a worker's backend facade (Cython pure-Python mode; backends.py stays the source): its selector is
# typed (selection.pxd), and the three calls a request makes on it (resolve, candidates, result) are cpdef, so
# the worker's L7Context reaches them in C.
cimport cython
from sentin8.selection cimport Selector
from sentin8.shm.breakers cimport BreakerTable
from sentin8.shm.counters cimport WorkerCounters

# the counters and the breakers typed: a request's ``allow``, ``record`` and counts are C calls through their
# vtables, not methods looked up by name (the breakers are None when [breaker] is off)
cdef class Backends:
    cdef public object _routes, _clock
    cdef public WorkerCounters _counters
    cdef public BreakerTable _breakers
    cdef public Selector _selector
    cdef public double _breaker_open_s
    cpdef table(self)
    cpdef resolve(self, hostname)
    @cython.locals(breakers=BreakerTable)
    cpdef list candidates(self, service, table=*)
    @cython.locals(breakers=BreakerTable)
    cpdef result(self, instance_id, ok)
