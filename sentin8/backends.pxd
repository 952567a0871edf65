# C layout of a worker's backend facade (Cython pure-Python mode; backends.py stays the source): its selector is
# typed (selection.pxd), and the three calls a request makes on it (resolve, candidates, result) are cpdef, so
# the worker's L7Context reaches them in C.
from sentin8.selection cimport Selector

cdef class Backends:
    cdef public object _routes, _counters, _clock, _breakers
    cdef public Selector _selector
    cdef public double _breaker_open_s
    cpdef table(self)
    cpdef resolve(self, hostname)
    cpdef list candidates(self, service, table=*)
    cpdef result(self, instance_id, ok)
