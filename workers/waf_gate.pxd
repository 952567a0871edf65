# C layout of the worker's WAF gate (Cython pure-Python mode; waf_gate.py stays the source). Every request the
# exchange admits for inspection asks ``enabled()`` first: with the gate and its policy typed, that is a C call
# reading struct members, not a method and two attributes looked up by name.
from sentin8.policy cimport EdgePolicy

cdef class WafGate:
    cdef public object loop, count, _pool, _build
    cdef public EdgePolicy policy
    cdef public double _log_window
    cdef public Py_ssize_t _logged
    cpdef bint enabled(self)
