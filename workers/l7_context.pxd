# C layout of a worker's L7Context (Cython pure-Python mode; l7_context.py stays the source): a cdef subclass
# of workers/l7/contract.pxd's base, its methods C overrides, its backend facade and its counters typed
# (backends.pxd, shm/counters.pxd): a request's selection and accounting are C calls.
from sentin8.backends cimport Backends
from sentin8.policy cimport EdgePolicy
from sentin8.shm.policy cimport PolicyCache
from sentin8.shm.counters cimport WorkerCounters
cimport cython
from workers.l7.contract cimport L7Context, RequestInfo
from workers.l7.exchange cimport Exchange

cdef class WorkerL7Context(L7Context):
    cdef public Backends backends
    cdef public WorkerCounters counters
    cdef public EdgePolicy edge_policy  # policy(): the cache's values and the check, C calls per request
    cdef public PolicyCache policy_values
    cdef public object gate, _upstream_tls, access_log
    cdef public Py_ssize_t inflight_now, inflight_cap
    cpdef resolve(self, host)
    cpdef candidates(self, service)
    cpdef backend_failed(self, instance)
    cpdef count(self, name, n=*)
    cpdef refused(self, refusal)
    cpdef service_id(self, service)
    cpdef upstream(self, sidx, name)
    @cython.locals(exchange=Exchange)
    cpdef request_done(self, ex, seconds)
    cpdef inflight(self, delta)
    @cython.locals(info=RequestInfo)
    cpdef policy(self, request)
    cpdef upstream_tls(self, instance)
    cpdef waf_gate(self)
    cpdef upstream_result(self, instance_id, ok)
    cpdef overloaded(self)
